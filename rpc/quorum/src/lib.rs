//! The master's records replicated by Raft, so that no one master process
//! or disk is a single point of failure (docs/protocol.md §12).
//!
//! A master keeps its records (catalog, journal, ledger, layout) as files
//! of one directory ([`bitfold_engine::store::Directory`]). With several
//! masters, each change to that directory (a file written whole, a file
//! deleted, bytes appended to a log file, a log file cut) is one entry of
//! a Raft log, replicated by [openraft](https://docs.rs/openraft); an entry
//! a majority of masters holds durably is applied, in log order, to every
//! master's copy of the directory. The leader's master writes through
//! [`ReplicatedDirectory`], whose writes return once their entry is
//! applied; the other masters only apply.
//!
//! - [`log`]: the Raft log and vote, on the master's disk;
//! - [`files`]: the state machine, the directory of files, and its snapshots;
//! - [`network`]: the messages between masters, over a [`Transport`] the
//!   caller provides (bitfold's servers carry them in Cap'n Proto calls);
//! - [`node`]: one master's Raft node ([`Quorum`]) and what it reports;
//! - `join`: how a master with a new data directory learns whether its
//!   cluster is new, and joins a running one as a new member;
//! - [`directory`]: the master's directory, replicated.

pub mod directory;
pub mod files;
mod join;
pub mod log;
pub mod network;
pub mod node;

use std::fmt;
use std::hash::Hasher;

use serde::{Deserialize, Serialize};

pub use directory::ReplicatedDirectory;
pub use network::Transport;
pub use node::{MemberState, Opening, Quorum, QuorumOptions, Standing};

openraft::declare_raft_types!(
    /// The Raft types of the masters' log: each entry one [`Change`] to
    /// the records directory; masters are numbered (see [`member_id`]) and
    /// known as a [`Member`].
    pub Records:
        D = Change,
        R = (),
        NodeId = u64,
        Node = Member,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// A master as Raft's membership records it: its name in the cluster file
/// and where it listens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its name (`m0`).
    pub name: String,
    /// Its address, `HOST:PORT`.
    pub addr: String,
}

/// One change to the records directory: what a log entry carries.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// File `name` now holds `bytes` (written whole, replacing any).
    Write {
        /// The file.
        name: String,
        /// Its whole content.
        bytes: Vec<u8>,
    },
    /// File `name` is gone.
    Delete {
        /// The file.
        name: String,
    },
    /// `bytes` are written at byte `at` of the append-only file `name`
    /// (created empty if missing).
    WriteAt {
        /// The file.
        name: String,
        /// Where in it.
        at: u64,
        /// What.
        bytes: Vec<u8>,
    },
    /// The append-only file `name` is cut to `len` bytes.
    Truncate {
        /// The file.
        name: String,
        /// Its new length.
        len: u64,
    },
    /// File `to` now holds what file `from` holds (replacing any), and
    /// `from` is gone: how a file too large for one entry is written, in
    /// pieces to `from` first.
    Rename {
        /// The file written in pieces.
        from: String,
        /// Its name.
        to: String,
    },
}

impl fmt::Debug for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Write { name, bytes } => write!(f, "write {name} ({} bytes)", bytes.len()),
            Change::Delete { name } => write!(f, "delete {name}"),
            Change::WriteAt { name, at, bytes } => {
                write!(f, "write {} bytes at {at} of {name}", bytes.len())
            }
            Change::Truncate { name, len } => write!(f, "cut {name} to {len} bytes"),
            Change::Rename { from, to } => write!(f, "rename {from} to {to}"),
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The Raft id a new cluster's master named `name` starts with: a hash of
/// the name, so the masters of a new cluster number each other the same
/// way without being told. A master that joins a running cluster (new, or
/// back with its data lost) takes a new id ([`node`]).
pub fn member_id(name: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(name.as_bytes());
    hasher.finish()
}
