//! The committed sample data is exactly what `bitfold sample` writes.

use std::fs;
use std::path::Path;

use crate::util::{bitfold, stderr};

#[test]
fn committed_sample_matches_the_generator() {
    let dir = tempfile::tempdir().unwrap();
    let run = bitfold(&["sample", "--out", dir.path().to_str().unwrap()]);
    assert!(
        run.status.success(),
        "bitfold sample failed: {}",
        stderr(&run)
    );
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/sample");
    let names = |dir: &Path| {
        let mut names: Vec<_> = fs::read_dir(dir.join("vectors"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        names(dir.path()),
        names(&committed),
        "the set of vector files differs"
    );
    for name in names(dir.path()) {
        let fresh = fs::read(dir.path().join("vectors").join(&name)).unwrap();
        let old = fs::read(committed.join("vectors").join(&name)).unwrap();
        assert!(
            fresh == old,
            "data/sample/vectors/{name:?} is stale: run `bitfold sample --out data/sample`"
        );
    }
    assert_eq!(
        fs::read_to_string(dir.path().join("index.toml")).unwrap(),
        fs::read_to_string(committed.join("index.toml")).unwrap(),
        "data/sample/index.toml is stale: run `bitfold sample --out data/sample`"
    );
}
