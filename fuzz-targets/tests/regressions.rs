//! Replays every input under `fuzz/regressions/<target>/` through its
//! target on stable (each once made a target fail, and must not again), and
//! every seed under `fuzz/seeds/<target>/` (inputs the oracles must pass).
//! As under `scripts/fuzz`'s `-malloc_limit_mb`, no input may make one
//! allocation over a bound: what an input merely claims must not be
//! reserved.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The largest single allocation replaying one input may make. Inputs are
/// at most 128 KiB (`-max_len`); the largest a reader believes before the
/// bytes arrive is 16 MiB (a connection's message buffer).
const MOST_BYTES_AT_ONCE: usize = 64 << 20;

/// The largest allocation since it was last reset.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, noting the largest allocation in [`LARGEST`].
struct Watched;

// SAFETY: every call is passed unchanged to the system allocator.
unsafe impl GlobalAlloc for Watched {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Watched = Watched;

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
        LARGEST.store(0, Ordering::Relaxed);
        let outcome = std::panic::catch_unwind(|| target(&input));
        assert!(outcome.is_ok(), "{name} fails on {}", path.display());
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest <= MOST_BYTES_AT_ONCE,
            "{name} allocated {largest} bytes at once on {}",
            path.display()
        );
        replayed += 1;
    }
    replayed
}
