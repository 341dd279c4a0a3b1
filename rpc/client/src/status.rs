//! What the master reports of its slaves (their state, the bytes they read
//! and sent), of the masters of a replicated cluster, and of the placement
//! of its vectors (copies missing, a move).

use std::time::SystemTime;

/// One slave as the master sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlaveStatus {
    /// Its name in the cluster file.
    pub name: String,
    /// Its address.
    pub addr: String,
    /// Whether it answers.
    pub up: bool,
    /// Since when it is up or down (as the master saw it).
    pub since: SystemTime,
    /// How many vectors it holds (last known).
    pub vectors: u64,
    /// Bytes of its data files (last known).
    pub bytes: u64,
    /// Bytes of vectors its folds have read since it started (last known).
    pub read_bytes: u64,
    /// Bytes it has sent to other processes since it started (last known).
    pub sent_bytes: u64,
    /// Why it is down.
    pub reason: Option<String>,
    /// When its TLS certificate expires (last known; none without TLS).
    pub certificate_expires: Option<SystemTime>,
}

/// One master of a replicated cluster, as the master that answered sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterState {
    /// Its name in the cluster file.
    pub name: String,
    /// Its address.
    pub addr: String,
    /// `leader`, `follower`, `learner` (catching up, not yet voting) or `down`.
    pub state: String,
    /// The last log entry it holds (as far as the leader knows, for another master).
    pub log_index: u64,
    /// The last log entry the answering master applied.
    pub applied: u64,
    /// The term the answering master is in.
    pub term: u64,
    /// Why it is down.
    pub reason: Option<String>,
}

/// What the master says of its slaves and of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Every slave, in cluster file order.
    pub slaves: Vec<SlaveStatus>,
    /// Every master of a replicated cluster; empty with a single master.
    pub masters: Vec<MasterState>,
    /// When the master's TLS certificate expires (none without TLS).
    pub master_certificate_expires: Option<SystemTime>,
}

impl Status {
    /// Every certificate in use that the master knows of, with when it
    /// expires: the master's (named `master`), then each slave's.
    pub fn certificates(&self) -> Vec<(String, SystemTime)> {
        let master = self
            .master_certificate_expires
            .map(|expires| ("master".to_owned(), expires));
        let slaves = self
            .slaves
            .iter()
            .filter_map(|s| Some((s.name.clone(), s.certificate_expires?)));
        master.into_iter().chain(slaves).collect()
    }
}

/// A time the wire carries in Unix seconds, 0 for none.
pub(crate) fn unix_seconds(seconds: i64) -> Option<SystemTime> {
    let seconds = u64::try_from(seconds).ok().filter(|&s| s > 0)?;
    SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(seconds))
}

/// Bytes the slaves of a cluster read and sent, added up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes of stored vectors their folds read.
    pub read_bytes: u64,
    /// Bytes they sent to other processes.
    pub sent_bytes: u64,
}

impl Traffic {
    /// What was read and sent after `before`.
    pub fn since(self, before: Traffic) -> Traffic {
        Traffic {
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            sent_bytes: self.sent_bytes.saturating_sub(before.sent_bytes),
        }
    }
}

/// How well the vectors are placed (docs/protocol.md §9).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlacementReport {
    /// Vectors in the catalog.
    pub vectors: u64,
    /// Vectors with fewer than `replicas` copies a query may read.
    pub under_replicated: u64,
    /// Vectors no live owner holds.
    pub lost: u64,
    /// Vectors not yet on their owners under the cluster file (during a move).
    pub misplaced: u64,
    /// Whether a move (`rebalance`) is in progress.
    pub moving: bool,
}

/// What one step of a move did, and how far the move is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoveProgress {
    /// Vids of the catalog the move has gone through.
    pub done: u64,
    /// Vids in the catalog.
    pub total: u64,
    /// Vectors this step copied to a new owner.
    pub copied: u64,
    /// Their bytes.
    pub copied_bytes: u64,
    /// Surplus copies this step removed.
    pub removed: u64,
    /// Whether every vector is now on exactly its owners.
    pub finished: bool,
}
