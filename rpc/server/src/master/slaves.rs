//! The master's view of each slave: up or down, since when and why, what
//! it holds, and which process and store it checked there.

use std::time::SystemTime;

/// What a slave holds and has done, as its last health answer said.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Holdings {
    /// Vectors it holds.
    pub(crate) vectors: u64,
    /// Bytes of its data files.
    pub(crate) bytes: u64,
    /// Bytes of vectors its folds have read since it started.
    pub(crate) read_bytes: u64,
    /// Bytes it has sent to other processes since it started.
    pub(crate) sent_bytes: u64,
}

/// What the master knows of one slave.
#[derive(Debug, Clone)]
pub(crate) struct SlaveState {
    /// Whether queries may use it.
    pub(crate) up: bool,
    /// When it last went up or down.
    pub(crate) since: SystemTime,
    /// Why it is down.
    pub(crate) reason: Option<String>,
    /// What it reported last.
    pub(crate) holdings: Holdings,
    /// Whether its catalog has been merged into the master's since it came up.
    pub(crate) synced: bool,
    /// The process the master checked there (0: none yet); every call
    /// names it, and a slave that has restarted since refuses the call.
    pub(crate) session: u64,
    /// The store the master checked there, and the last write the master
    /// saw it apply.
    pub(crate) store: u64,
    pub(crate) applied: u64,
}

impl SlaveState {
    /// A slave not contacted yet.
    pub(crate) fn unknown() -> SlaveState {
        SlaveState {
            up: false,
            since: SystemTime::now(),
            reason: Some("not contacted yet".into()),
            holdings: Holdings::default(),
            synced: false,
            session: 0,
            store: 0,
            applied: 0,
        }
    }

    /// Marks it down for `reason`; returns whether it was up.
    pub(crate) fn down(&mut self, reason: String) -> bool {
        let was_up = self.up;
        if was_up {
            self.since = SystemTime::now();
        }
        self.up = false;
        self.synced = false;
        self.reason = Some(reason);
        was_up
    }

    /// Marks it up (answering, catalog merged); returns whether it was down.
    pub(crate) fn come_up(&mut self) -> bool {
        let was_down = !self.up;
        if was_down {
            self.since = SystemTime::now();
        }
        self.up = true;
        self.synced = true;
        self.reason = None;
        was_down
    }
}
