//! Replays every input under `fuzz/regressions/<target>/` through its
//! target on stable (each once made a target fail, and must not again), and
//! every seed under `fuzz/seeds/<target>/` (inputs the oracles must pass).

use std::fs;
use std::path::Path;

#[test]
fn every_regression_input_passes_its_target() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut replayed = 0;
    for (name, target) in bitfold_fuzz_targets::TARGETS {
        replayed += replay(&fuzz.join("regressions").join(name), name, target);
        let seeds = replay(&fuzz.join("seeds").join(name), name, target);
        assert!(seeds > 0, "no seeds for {name}");
    }
    assert!(
        replayed > 0,
        "no regression inputs under {}",
        fuzz.display()
    );
}

/// Runs `target` on every file in `dir` (none if it is missing); how many.
fn replay(dir: &Path, name: &str, target: bitfold_fuzz_targets::Target) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut replayed = 0;
    for entry in entries {
        let path = entry.expect("an input directory lists").path();
        let input = fs::read(&path).expect("an input reads");
        let outcome = std::panic::catch_unwind(|| target(&input));
        assert!(outcome.is_ok(), "{name} fails on {}", path.display());
        replayed += 1;
    }
    replayed
}
