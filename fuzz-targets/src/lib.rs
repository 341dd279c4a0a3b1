//! The fuzz targets of bitfold, one function per decoder: each takes the
//! fuzzer's bytes, feeds them to the decoder, and panics if the decoder
//! panics, disagrees with its oracle, or reports an error that points
//! outside its input. `fuzz/` runs them under libFuzzer (nightly); the test
//! in `tests/regressions.rs` replays every input under
//! `fuzz/regressions/<target>/` on stable, so a fixed crash stays fixed.

mod files;
mod framing;
mod index;
mod master;
mod message;
mod pairs;
mod portable;
mod query;
mod reply;
mod store;
mod update;
mod wire;

pub use framing::framing;
pub use index::index;
pub use master::master;
pub use pairs::pairs;
pub use portable::portable;
pub use query::query;
pub use reply::reply;
pub use store::store;
pub use update::update;
pub use wire::wire;

/// A fuzz target: panics if the decoder it drives fails on `data`.
pub type Target = fn(data: &[u8]);

/// Every target by name, as `fuzz/fuzz_targets/<name>.rs` and
/// `fuzz/regressions/<name>/` name it.
pub const TARGETS: [(&str, Target); 10] = [
    ("query", query),
    ("portable", portable),
    ("pairs", pairs),
    ("store", store),
    ("wire", wire),
    ("framing", framing),
    ("index", index),
    ("master", master),
    ("update", update),
    ("reply", reply),
];
