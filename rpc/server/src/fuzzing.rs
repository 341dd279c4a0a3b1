//! What the fuzz targets drive in the servers (cargo feature `fuzzing`, off
//! by default): a master's start without a network ([`master_restart`]),
//! as far as it reads its data directory and the cluster file before it
//! serves, and a second start on the records it writes of what it read.
//!
//! Only the master's own files are reached this way. The decoders of the
//! messages one process reads from another (a vector's parts, an import's
//! vectors, an update's changes, hop reports, a coordinator's failed
//! machines, a `fetchMany` reply's copies) are `bitfold-proto`'s public
//! API, and the stream framing `bitfold-net`'s: the servers call them and
//! the fuzz targets call the same functions, with no feature. The master's
//! journal, ledger and layout records are read by no one else, and a start
//! that reads them, writes them again and starts on what it wrote is a
//! round trip no server makes, summed up in plain values ([`Started`]) only
//! an oracle needs: as public API it would widen the crate for that one
//! caller, so it stays behind the feature, which no served binary enables.

pub use crate::master::start::{Started, restart as master_restart};
