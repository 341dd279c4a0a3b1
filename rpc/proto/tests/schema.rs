//! The committed generated code matches `schema/bitfold.capnp`.

use std::path::Path;
use std::process::Command;

#[test]
fn generated_code_is_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let found = Command::new("capnp").arg("--version").output();
    assert!(
        found.is_ok_and(|out| out.status.success()),
        "the Cap'n Proto compiler `capnp` is needed to check the generated code: \
         install it with `apt-get install capnproto`"
    );
    let out = tempfile::tempdir().expect("a temporary directory");
    capnpc::CompilerCommand::new()
        .src_prefix(root.join("schema"))
        .file(root.join("schema/bitfold.capnp"))
        .output_path(out.path())
        .run()
        .expect("capnp compiles schema/bitfold.capnp");
    let fresh = std::fs::read_to_string(out.path().join("bitfold_capnp.rs")).unwrap();
    let committed = std::fs::read_to_string(root.join("rpc/proto/src/bitfold_capnp.rs")).unwrap();
    assert!(
        fresh == committed,
        "rpc/proto/src/bitfold_capnp.rs is stale: run schema/regen.sh and commit the result"
    );
}
