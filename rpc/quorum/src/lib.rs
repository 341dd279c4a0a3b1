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

use bitfold_engine::store::{Directory, read_sealed};
use serde::de::DeserializeOwned;
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

/// What a master does about a damaged file of its Raft folder.
pub(crate) const REMOVE_THE_DATA: &str = "restore the master's data directory from a backup, or remove it and start the master \
     again (it joins the others as a new member)";

/// Reads sealed file `name` of `dir`, a value in postcard, if it is there;
/// a damaged file is an error naming it and then `fix`.
pub(crate) fn read_kept<T: DeserializeOwned>(
    dir: &dyn Directory,
    name: &str,
    fix: &str,
) -> Result<Option<T>, String> {
    let damaged = |e: String| format!("{} is damaged ({e}): {fix}", dir.path(name).display());
    match read_sealed(dir, name) {
        Ok(body) => postcard::from_bytes(&body)
            .map(Some)
            .map_err(|e| damaged(e.to_string())),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(damaged(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use bitfold_engine::store::{MemoryDirectory, write_sealed};

    use super::*;

    #[test]
    fn a_kept_value_reads_back_is_none_when_absent_and_damage_names_the_file_and_fix() {
        let dir = MemoryDirectory::new();
        let absent: Option<u64> = read_kept(&dir, "vote", "fix it").unwrap();
        assert_eq!(absent, None);
        write_sealed(&dir, "vote", &postcard::to_stdvec(&7u64).unwrap()).unwrap();
        assert_eq!(read_kept::<u64>(&dir, "vote", "fix it").unwrap(), Some(7));
        // A sealed file whose body is not the value, and one cut short.
        write_sealed(&dir, "vote", b"").unwrap();
        let wrong = read_kept::<u64>(&dir, "vote", "fix it").unwrap_err();
        let mut cut = dir.create("purged").unwrap();
        cut.write_all(b"not sealed").unwrap();
        cut.commit().unwrap();
        let damaged = read_kept::<u64>(&dir, "purged", "fix it").unwrap_err();
        for (error, name) in [(wrong, "vote"), (damaged, "purged")] {
            assert!(error.contains(&format!("{name} is damaged")), "{error}");
            assert!(error.ends_with(": fix it"), "{error}");
        }
    }
}
