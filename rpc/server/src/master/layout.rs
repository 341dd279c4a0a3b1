//! Where the master places vectors: the recorded layout reads use and,
//! while vectors move to a new one (`rebalance`), that target too.

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

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(slaves: usize, replicas: usize) -> ClusterConfig {
        ClusterConfig {
            replicas,
            group: 1,
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
