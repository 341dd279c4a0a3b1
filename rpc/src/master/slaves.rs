//! The master's view of each slave: up or down, since when and why, and
//! what it holds.

use std::time::SystemTime;

/// What the master knows of one slave.
#[derive(Debug, Clone)]
pub(crate) struct SlaveState {
    /// Whether queries may use it.
    pub(crate) up: bool,
    /// When it last went up or down.
    pub(crate) since: SystemTime,
    /// Why it is down.
    pub(crate) reason: Option<String>,
    /// Vectors and bytes it reported last.
    pub(crate) vectors: u64,
    pub(crate) bytes: u64,
    /// Whether its catalog has been merged into the master's since it came up.
    pub(crate) synced: bool,
}

impl SlaveState {
    /// A slave not contacted yet.
    pub(crate) fn unknown() -> SlaveState {
        SlaveState {
            up: false,
            since: SystemTime::now(),
            reason: Some("not contacted yet".into()),
            vectors: 0,
            bytes: 0,
            synced: false,
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
