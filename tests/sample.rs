//! The committed sample is fresh: `data/customers.csv` is exactly what
//! `bitfold sample` writes, and `data/sample` exactly what `bitfold index`
//! makes of it.

use std::fs;
use std::path::Path;

use crate::util::{bitfold, stderr};

fn data() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data")
}

#[test]
fn committed_table_matches_the_generator() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("customers.csv");
    let run = bitfold(&["sample", "--out", csv.to_str().unwrap()]);
    assert!(
        run.status.success(),
        "bitfold sample failed: {}",
        stderr(&run)
    );
    assert!(
        fs::read(&csv).unwrap() == fs::read(data().join("customers.csv")).unwrap(),
        "data/customers.csv is stale: run `bitfold sample --out data/customers.csv`"
    );
}

#[test]
fn committed_index_matches_bitfold_index() {
    let dir = tempfile::tempdir().unwrap();
    let table = data().join("customers.csv");
    let run = bitfold(&[
        "index",
        table.to_str().unwrap(),
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "bitfold index failed: {}",
        stderr(&run)
    );
    let committed = data().join("sample");
    let stale = "data/sample is stale: run `rm -r data/sample && bitfold index data/customers.csv --out data/sample`";
    let names = |dir: &Path| {
        let mut names: Vec<_> = fs::read_dir(dir.join("vectors"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(dir.path()), names(&committed), "{stale}");
    for name in names(dir.path()) {
        let fresh = fs::read(dir.path().join("vectors").join(&name)).unwrap();
        let old = fs::read(committed.join("vectors").join(&name)).unwrap();
        assert!(fresh == old, "{name:?} differs: {stale}");
    }
    assert_eq!(
        fs::read_to_string(dir.path().join("index.toml")).unwrap(),
        fs::read_to_string(committed.join("index.toml")).unwrap(),
        "{stale}"
    );
}
