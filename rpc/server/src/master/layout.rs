//! Where the master places vectors: the recorded layout reads use and,
//! while vectors move to a new one (`rebalance`), that target too.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::cluster::{ClusterConfig, SlaveEntry};

/// The layout in force, shared (behind an `Rc`) by the calls in flight:
/// `rebalance` installs a new one; a call keeps the one it started with.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    /// The layout vectors are read from.
    pub(super) current: ClusterConfig,
    /// During a move, the layout vectors are being copied to; writes go to
    /// the owners under both.
    pub(super) target: Option<ClusterConfig>,
}

impl Layout {
    /// Every slave the master deals with, in cluster order: those of the
    /// longer of the two layouts (one's list is a prefix of the other's).
    pub(super) fn slaves(&self) -> &[SlaveEntry] {
        match &self.target {
            Some(target) if target.slaves.len() > self.current.slaves.len() => &target.slaves,
            _ => &self.current.slaves,
        }
    }

    /// The owners a query reads vector `vid` from.
    pub(super) fn read_owners(&self, vid: u64) -> Vec<usize> {
        self.current.placement().owners(vid)
    }

    /// The owners every write of vector `vid` must reach: under the current
    /// layout and, during a move, under the target too.
    pub(super) fn write_owners(&self, vid: u64) -> Vec<usize> {
        let mut owners = self.read_owners(vid);
        if let Some(target) = &self.target {
            for owner in target.placement().owners(vid) {
                if !owners.contains(&owner) {
                    owners.push(owner);
                }
            }
        }
        owners
    }
}

/// Where vectors are placed now, and how far a move has got: the layout
/// changes only by the steps of a move, each of which returns the layout it
/// replaced, so that the per-slave state can be fitted to the new one.
pub(super) struct Placement {
    layout: RefCell<Rc<Layout>>,
    /// During a move, the first vid not yet copied to its new owners.
    move_next: Cell<u64>,
}

impl Placement {
    /// The layout recorded, and during a move the first vid not yet copied.
    pub(super) fn new(layout: Layout, move_next: u64) -> Placement {
        Placement {
            layout: RefCell::new(Rc::new(layout)),
            move_next: Cell::new(move_next),
        }
    }

    /// The layout in force now.
    pub(super) fn now(&self) -> Rc<Layout> {
        Rc::clone(&self.layout.borrow())
    }

    /// During a move, the first vid not yet copied to its new owners.
    pub(super) fn move_next(&self) -> u64 {
        self.move_next.get()
    }

    /// Starts a move to `target`: writes go to the owners under both
    /// layouts, queries read from the current ones, nothing is copied yet.
    pub(super) fn begin_move(&self, target: ClusterConfig) -> Rc<Layout> {
        let old = self.now();
        self.move_next.set(0);
        self.install(Layout {
            current: old.current.clone(),
            target: Some(target),
        })
    }

    /// Notes that every vid before `next` has been copied to its new owners.
    pub(super) fn copied_before(&self, next: u64) {
        debug_assert!(self.now().target.is_some(), "copies are made during a move");
        self.move_next.set(next);
    }

    /// Makes the move's `target` the layout queries read from (writes still
    /// go to the owners under both, until [`Placement::end_move`]).
    pub(super) fn read_from_target(&self, target: ClusterConfig) -> Rc<Layout> {
        self.install(Layout {
            current: target.clone(),
            target: Some(target),
        })
    }

    /// Ends the move: its `target` is the one layout.
    pub(super) fn end_move(&self, target: ClusterConfig) -> Rc<Layout> {
        self.install(Layout {
            current: target,
            target: None,
        })
    }

    /// Installs `layout`; returns the one it replaced.
    fn install(&self, layout: Layout) -> Rc<Layout> {
        self.layout.replace(Rc::new(layout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(slaves: usize, replicas: usize) -> ClusterConfig {
        ClusterConfig {
            replicas,
            group: 1,
            piece: crate::pieces::DEFAULT_PIECE,
            slaves: (0..slaves)
                .map(|i| SlaveEntry {
                    name: format!("s{i}"),
                    addr: format!("h:{i}"),
                })
                .collect(),
        }
    }

    #[test]
    fn during_a_move_writes_reach_the_owners_of_both_layouts() {
        let layout = Layout {
            current: cluster(4, 1),
            target: Some(cluster(5, 2)),
        };
        assert_eq!(layout.slaves().len(), 5);
        let mut moved = 0;
        for vid in 0..1000 {
            let read = layout.read_owners(vid);
            let write = layout.write_owners(vid);
            assert_eq!(read.len(), 1);
            assert!(write.starts_with(&read));
            let target = cluster(5, 2).placement().owners(vid);
            assert!(target.iter().all(|o| write.contains(o)));
            moved += usize::from(!target.contains(&read[0]));
        }
        assert!(moved > 0 && moved < 500, "{moved}");
        let settled = Layout {
            current: cluster(3, 1),
            target: None,
        };
        assert_eq!(settled.write_owners(7), settled.read_owners(7));
    }
}
