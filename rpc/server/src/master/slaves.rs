//! The master's view of each slave: up or down, since when and why, what
//! it holds, and which process and store it checked there.

use std::cell::{Cell, Ref, RefCell};
use std::collections::BTreeSet;
use std::time::SystemTime;

use super::layout::Layout;
use crate::chain::VidRun;

/// What a slave holds and has done, as its last health answer said.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Holdings {
    /// Vectors it holds.
    pub(super) vectors: u64,
    /// Bytes of its data files.
    pub(super) bytes: u64,
    /// Bytes of vectors its folds have read since it started.
    pub(super) read_bytes: u64,
    /// Bytes it has sent to other processes since it started.
    pub(super) sent_bytes: u64,
    /// When its TLS certificate expires (Unix seconds; 0 without TLS).
    pub(super) certificate_not_after: i64,
}

/// What the master knows of one slave.
#[derive(Debug, Clone)]
pub(super) struct SlaveState {
    /// Whether queries may use it.
    pub(super) up: bool,
    /// When it last went up or down.
    pub(super) since: SystemTime,
    /// Why it is down.
    pub(super) reason: Option<String>,
    /// What it reported last.
    pub(super) holdings: Holdings,
    /// Whether its catalog has been merged into the master's since it came up.
    pub(super) synced: bool,
    /// The process the master checked there (0: none yet); every call
    /// names it, and a slave that has restarted since refuses the call.
    pub(super) session: u64,
    /// The store the master checked there, and the last write the master
    /// saw it apply.
    pub(super) store: u64,
    pub(super) applied: u64,
}

impl SlaveState {
    /// A slave not contacted yet.
    fn unknown() -> SlaveState {
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
    fn down(&mut self, reason: String) -> bool {
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
    fn come_up(&mut self) -> bool {
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

/// What the master knows of every slave of the layout, by index: its state,
/// and the vectors it owns but may not serve. Each list has one entry per
/// slave of the layout ([`Slaves::fit`]), and a slave's missed vids are
/// always among those it lacks.
pub(super) struct Slaves {
    states: RefCell<Vec<SlaveState>>,
    /// Per slave, the vids it owns but does not hold (`refill`).
    lacking: RefCell<Vec<BTreeSet<u64>>>,
    /// Per slave, those of `lacking` it may hold but missed writes to (its
    /// store was replaced), as recorded in the data directory (`missed`).
    missed: RefCell<Vec<BTreeSet<u64>>>,
    /// Missed vectors copied back since the record was last written.
    recopied: Cell<usize>,
}

/// What copying vectors back to a slave left ([`Slaves::copied_back`]).
pub(super) struct CopiedBack {
    /// It lacks no vector now.
    pub(super) whole: bool,
    /// The record of missed writes is due to be written again.
    pub(super) record: bool,
}

impl Slaves {
    /// `count` slaves not contacted yet, with the writes the record says
    /// each missed (one set per slave).
    pub(super) fn new(count: usize, missed: Vec<BTreeSet<u64>>) -> Slaves {
        debug_assert_eq!(missed.len(), count);
        Slaves {
            states: RefCell::new(vec![SlaveState::unknown(); count]),
            lacking: RefCell::new(missed.clone()),
            missed: RefCell::new(missed),
            recopied: Cell::new(0),
        }
    }

    /// Every slave's state, to read.
    pub(super) fn states(&self) -> Ref<'_, [SlaveState]> {
        Ref::map(self.states.borrow(), Vec::as_slice)
    }

    /// Whether slave `index` is up.
    pub(super) fn is_up(&self, index: usize) -> bool {
        self.states.borrow()[index].up
    }

    /// The slaves that are up.
    pub(super) fn live(&self) -> Vec<usize> {
        let states = self.states.borrow();
        (0..states.len()).filter(|&i| states[i].up).collect()
    }

    /// The slaves to probe: those down, and those whose catalog is not merged.
    pub(super) fn unsettled(&self) -> Vec<usize> {
        let states = self.states.borrow();
        (0..states.len())
            .filter(|&i| !states[i].up || !states[i].synced)
            .collect()
    }

    /// The session of slave `index` that calls name (0, which no process
    /// has, for a slave the layout no longer has).
    pub(super) fn session(&self, index: usize) -> u64 {
        self.states.borrow().get(index).map_or(0, |s| s.session)
    }

    /// Marks slave `index` down for `reason`; returns whether it was up.
    pub(super) fn down(&self, index: usize, reason: &str) -> bool {
        self.states.borrow_mut()[index].down(reason.to_owned())
    }

    /// Marks slave `index` up; returns whether it was down.
    pub(super) fn come_up(&self, index: usize) -> bool {
        self.states.borrow_mut()[index].come_up()
    }

    /// Notes what slave `index` said it holds.
    pub(super) fn report(&self, index: usize, holdings: Holdings) {
        self.states.borrow_mut()[index].holdings = holdings;
    }

    /// Notes that slave `index` is now process `session`, with `store`
    /// having applied write `applied`: its catalog is to be merged again.
    pub(super) fn checked(&self, index: usize, session: u64, store: u64, applied: u64) {
        let state = &mut self.states.borrow_mut()[index];
        state.session = session;
        state.store = store;
        state.applied = applied;
        state.synced = false;
    }

    /// Notes that slave `index`'s `store` has applied write `write`
    /// (ignored for another store than the one checked there).
    pub(super) fn saw_applied(&self, index: usize, store: u64, write: u64) {
        if let Some(known) = self.states.borrow_mut().get_mut(index)
            && store == known.store
        {
            known.applied = known.applied.max(write);
        }
    }

    /// Whether slave `index` holds every vector of a run as it should be:
    /// it is up and lacks none of them. The states are borrowed once, not
    /// per question.
    pub(super) fn holding(&self) -> impl Fn(usize, VidRun) -> bool + '_ {
        let states = self.states.borrow();
        let lacking = self.lacking.borrow();
        move |index, run| states[index].up && lacking[index].range(run.vids()).next().is_none()
    }

    /// The vids slave `index` owns but does not hold.
    pub(super) fn lacking(&self, index: usize) -> Ref<'_, BTreeSet<u64>> {
        Ref::map(self.lacking.borrow(), |l| &l[index])
    }

    /// Notes that slave `index` lacks `lacking` now: those it missed writes
    /// to and no longer lacks (deleted or moved away since) are moot.
    pub(super) fn note_lacking(&self, index: usize, lacking: BTreeSet<u64>) {
        self.missed.borrow_mut()[index].retain(|vid| lacking.contains(vid));
        self.lacking.borrow_mut()[index] = lacking;
    }

    /// Takes the vids slave `index` was noted lacking, to be noted again
    /// with [`Slaves::note_lacking`].
    pub(super) fn take_lacking(&self, index: usize) -> BTreeSet<u64> {
        std::mem::take(&mut self.lacking.borrow_mut()[index])
    }

    /// Notes that slave `index` missed every write to `vids` (its store was
    /// replaced): it lacks them until they are copied back.
    pub(super) fn note_missed(&self, index: usize, vids: Vec<u64>) {
        self.missed.borrow_mut()[index].extend(vids.iter().copied());
        self.lacking.borrow_mut()[index].extend(vids);
    }

    /// Forgets deleted vectors; returns whether a missed one was among
    /// them (the record names vectors that no longer exist).
    pub(super) fn forget(&self, vids: &BTreeSet<u64>) -> bool {
        for lacking in self.lacking.borrow_mut().iter_mut() {
            lacking.retain(|vid| !vids.contains(vid));
        }
        let mut dropped = false;
        for missed in self.missed.borrow_mut().iter_mut() {
            let before = missed.len();
            missed.retain(|vid| !vids.contains(vid));
            dropped |= missed.len() != before;
        }
        dropped
    }

    /// Notes that `vids` were copied back to slave `index`.
    ///
    /// A record of missed writes left behind only copies those vectors once
    /// more; but a master restarted with an old one would refuse copies that
    /// are right, with no owner left to copy from if a partner has lost its
    /// data since. So it is due once the vectors copied back since it was
    /// written are an eighth of those it still names (every round for a
    /// small one, geometrically fewer times for a large one), or the slave
    /// lacks nothing.
    pub(super) fn copied_back(&self, index: usize, vids: &[u64]) -> CopiedBack {
        let mut lacking = self.lacking.borrow_mut();
        let mut missed = self.missed.borrow_mut();
        let mut recopied = false;
        for vid in vids {
            lacking[index].remove(vid);
            recopied |= missed[index].remove(vid);
        }
        let whole = lacking[index].is_empty();
        let mut record = false;
        if recopied {
            let since = self.recopied.get() + vids.len();
            let named: usize = missed.iter().map(BTreeSet::len).sum();
            record = whole || since.saturating_mul(8) >= named;
            self.recopied.set(if record { 0 } else { since });
        }
        CopiedBack { whole, record }
    }

    /// Per slave, the vids it missed writes to, for the record.
    pub(super) fn missed(&self) -> Ref<'_, [BTreeSet<u64>]> {
        Ref::map(self.missed.borrow(), Vec::as_slice)
    }

    /// Fits every list to the slaves of `new`, replacing `old`: a slave at a
    /// new address is a new machine, not contacted yet.
    pub(super) fn fit(&self, old: &Layout, new: &Layout) {
        let count = new.slaves().len();
        let mut states = self.states.borrow_mut();
        states.resize(count, SlaveState::unknown());
        for (i, slave) in new.slaves().iter().enumerate() {
            if old
                .slaves()
                .get(i)
                .is_some_and(|was| was.addr != slave.addr)
            {
                states[i] = SlaveState::unknown();
            }
        }
        self.lacking.borrow_mut().resize(count, BTreeSet::new());
        self.missed.borrow_mut().resize(count, BTreeSet::new());
    }
}
