//! Running one test body against both kinds of directory.

/// Runs each test body (a function taking `&dyn Backend` or `&impl Backend`)
/// against a real directory (`$disk`, given a fresh temporary directory) and
/// against the in-memory one (`$memory`, given a fresh `MemoryDirectory`).
macro_rules! on_both_backends {
    ($disk:path, $memory:path; $($test:ident),* $(,)?) => {
        mod disk {
            $(#[test] fn $test() { super::$test(&$disk(tempfile::tempdir().unwrap())) })*
        }
        mod memory {
            $(#[test] fn $test() { super::$test(&$memory(Default::default())) })*
        }
    };
}
