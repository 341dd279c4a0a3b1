//! Which slaves own a vector (docs/protocol.md §4).
//!
//! With `n` slaves in cluster-file order, the owners of vid `v` are slaves
//! `j, j+1, ..., j+replicas-1 (mod n)` where
//! `j = jump_consistent_hash(fmix64(v), n)`: consecutive vids (the bins of one
//! attribute) must spread over the slaves, and jump hash alone would put
//! small keys in low buckets far too often, so it is fed a well-mixed key.
//! Changing the mixer moves every vector.
//!
//! ```
//! use bitfold_server::placement::owners;
//!
//! let o = owners(42, 4, 2);
//! assert_eq!(o.len(), 2);
//! assert_eq!(o[1], (o[0] + 1) % 4);
//! ```

use bitfold_engine::mix::fmix64;

use crate::pieces::{Pieces, VID_BITS};

/// Jump consistent hash (Lamping & Veach, 2014): the bucket in `0..buckets`
/// of `key`; adding a bucket at the end moves about `1/(buckets+1)` of the
/// keys, all into the new bucket.
///
/// Written here rather than taken from a crate: `jump-consistent-hash` 0.1
/// computes `key * 2862933555777941757 + 1` without wrapping, which
/// overflows (a panic in debug builds), and `jumphash` hashes with random
/// SipHash keys, so two processes would disagree on placement.
///
/// # Panics
///
/// If `buckets` is zero.
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    assert!(buckets > 0, "jump hash needs at least one bucket");
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// The first owner of `vid` among `slaves` slaves.
///
/// # Panics
///
/// If `slaves` is zero or does not fit in `u32`.
pub fn primary(vid: u64, slaves: usize) -> usize {
    let buckets = u32::try_from(slaves).expect("at most 2^32 - 1 slaves");
    jump_consistent_hash(fmix64(vid), buckets) as usize
}

/// The owners of `vid`, primary first: `replicas` consecutive slave indices (mod `slaves`).
///
/// # Panics
///
/// If `slaves` is zero, or `replicas` is zero or above `slaves`.
pub fn owners(vid: u64, slaves: usize, replicas: usize) -> Vec<usize> {
    assert!(
        (1..=slaves).contains(&replicas),
        "replicas must be in 1..=slaves"
    );
    let first = primary(vid, slaves);
    (0..replicas).map(|i| (first + i) % slaves).collect()
}

/// How a cluster places vectors: `slaves` slaves in cluster-file order,
/// `replicas` copies of every vector, `group` consecutive vids (an
/// aligned block, `group` a power of two, or [`GROUP_ALL`]) sharing their
/// owners, so that a range of vids visits fewer machines, and vectors cut
/// into `pieces`, each piece of a group placed on its own.
///
/// Its methods take keys ([`Pieces::key`]): piece `p` of the vids of group
/// `g` is placed by the key of piece `p` of vid `g`, so piece 0 is placed
/// as a vector is without pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Slaves in the cluster.
    pub slaves: usize,
    /// Copies of every vector.
    pub replicas: usize,
    /// Consecutive vids placed together (a power of two; 1 places each vid
    /// on its own, [`GROUP_ALL`] every vid of a piece together).
    pub group: u64,
    /// How vectors are cut.
    pub pieces: Pieces,
}

/// The `group` that places every vid together (`group = "all"`): piece `p`
/// of every vector on the same owners, so that a query's AND within a
/// piece is local to one machine.
pub const GROUP_ALL: u64 = u64::MAX;

/// Vids in a block whose reads the master sends to one replica set (see
/// [`Placement::reader`]).
pub const READ_BLOCK: u64 = 256;

impl Placement {
    /// The owners of `key`, primary first.
    ///
    /// # Panics
    ///
    /// If `slaves` is zero, `replicas` is not in `1..=slaves`, or `group` is zero.
    pub fn owners(&self, key: u64) -> Vec<usize> {
        owners(self.spot(key), self.slaves, self.replicas)
    }

    /// What places `key`: the key of its piece of its group's index.
    fn spot(&self, key: u64) -> u64 {
        let (vid, piece) = self.pieces.split(key);
        (u64::from(piece) << VID_BITS) | self.group_index(vid)
    }

    /// The index of `vid`'s group.
    fn group_index(&self, vid: u64) -> u64 {
        if self.group == GROUP_ALL {
            0
        } else {
            vid / self.group
        }
    }

    /// The owner a query reads `vid` from, among those `up` says are live,
    /// where its term covers a whole aggregate block spanning groups (the
    /// master reads other vids from whichever owners ask the fewest
    /// machines); `None` when none is live.
    ///
    /// A slave can answer a block of vids with one stored aggregate only
    /// when it is asked for every vid of the block that it holds. So every
    /// vid of one [`READ_BLOCK`]-aligned block is read from owners of one
    /// replica class (index modulo `replicas`), the class turning from
    /// block to block so that every slave gets its share of the reads; a
    /// down owner is replaced by the next live one. (With [`GROUP_ALL`],
    /// the class is the piece's, turned by the query: see
    /// [`Placement::reader_among`]; this is turn 0.)
    pub fn reader(&self, vid: u64, up: impl Fn(usize) -> bool) -> Option<usize> {
        self.reader_among(&self.owners(vid), vid, 0, up)
    }

    /// The keys around `key` that share its owners and its replica class:
    /// the intersection of its group and its [`READ_BLOCK`] (with
    /// [`GROUP_ALL`], its whole piece). Every key of it has the same
    /// [`Placement::reader`] whenever the same owners are up.
    pub fn read_run(&self, key: u64) -> std::ops::RangeInclusive<u64> {
        let (vid, piece) = self.pieces.split(key);
        if self.group == GROUP_ALL {
            // One group, and one replica class for the whole piece.
            return self.pieces.key(0, piece)..=self.pieces.key(self.pieces.max_vid(), piece);
        }
        let group = vid - vid % self.group;
        let block = vid - vid % READ_BLOCK;
        let first = group.max(block);
        let last = group
            .saturating_add(self.group - 1)
            .min(block + (READ_BLOCK - 1));
        self.pieces.key(first, piece)..=self.pieces.key(last, piece)
    }

    /// The owner [`Placement::reader_among`] picks for `vid` in the
    /// query's `turn` whenever it is up: the first of `owners` in `vid`'s
    /// replica class.
    pub fn preferred(&self, owners: &[usize], vid: u64, turn: u64) -> Option<usize> {
        let class = self.read_class(vid, turn);
        owners.iter().copied().find(|&o| o % self.replicas == class)
    }

    /// The replica class (owner index modulo `replicas`) `key` is read
    /// from while its owners of that class are up: by read block; or with
    /// [`GROUP_ALL`] by piece plus the query's `turn`, so that every vid of
    /// a piece is read on one machine, the pieces spread over the replicas
    /// and a piece's reads turn from replica to replica from query to query.
    fn read_class(&self, key: u64, turn: u64) -> usize {
        let class = if self.group == GROUP_ALL {
            u64::from(self.pieces.split(key).1).wrapping_add(turn)
        } else {
            key / READ_BLOCK
        };
        (class % self.replicas as u64) as usize
    }

    /// The owner a query in its `turn` reads `vid` from, given its `owners`
    /// (the [`Placement::owners`] of any vid of its group), among those `up`
    /// says are live ([`Placement::reader`]).
    pub fn reader_among(
        &self,
        owners: &[usize],
        vid: u64,
        turn: u64,
        up: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let class = self.read_class(vid, turn);
        owners
            .iter()
            .copied()
            .find(|&o| o % self.replicas == class && up(o))
            .or_else(|| owners.iter().copied().find(|&o| up(o)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_hash_matches_the_reference_implementation() {
        // Published values of the paper's C++ code: ClickHouse's
        // `jumpConsistentHash` test and the `jump-consistent-hash` crate's docs.
        let cases: [(u64, u32, u32); 9] = [
            (1, 1, 0),
            (42, 57, 43),
            (256, 1024, 520),
            (3_735_883_980, 1, 0),
            (3_735_883_980, 666, 361),
            (16_045_690_984_833_335_023, 255, 237),
            (0, 60, 0),
            (1, 60, 55),
            (2, 60, 46),
        ];
        for (key, buckets, bucket) in cases {
            assert_eq!(
                jump_consistent_hash(key, buckets),
                bucket,
                "key {key} over {buckets} buckets"
            );
        }
    }

    #[test]
    fn adding_a_slave_moves_about_one_in_n_only_into_it() {
        let keys = 100_000u64;
        let mut moved = 0;
        for vid in 0..keys {
            let before = primary(vid, 10);
            let after = primary(vid, 11);
            if before != after {
                assert_eq!(after, 10, "vid {vid} moved between old slaves");
                moved += 1;
            }
        }
        let share = moved as f64 / keys as f64;
        assert!((0.08..0.10).contains(&share), "moved {share} (ideal 1/11)");
    }

    #[test]
    fn consecutive_vids_spread_evenly() {
        let mut counts = [0u32; 5];
        for vid in 0..50_000 {
            counts[primary(vid, 5)] += 1;
        }
        for count in counts {
            assert!((9_000..11_000).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn replicas_are_the_next_slaves() {
        for vid in [0, 7, u64::MAX, u64::MAX - 1] {
            let o = owners(vid, 4, 3);
            assert_eq!(o, vec![o[0], (o[0] + 1) % 4, (o[0] + 2) % 4]);
            assert_eq!(owners(vid, 4, 1), vec![o[0]]);
        }
        assert_eq!(owners(5, 1, 1), vec![0]);
    }

    #[test]
    fn a_group_of_consecutive_vids_shares_its_owners() {
        let placement = Placement {
            slaves: 5,
            replicas: 2,
            group: 16,
            pieces: Pieces::whole(),
        };
        for vid in [0, 17, 4_000, u64::MAX - 20] {
            let first = vid - vid % 16;
            assert_eq!(placement.owners(vid), placement.owners(first));
            assert_eq!(placement.owners(vid), owners(vid / 16, 5, 2));
        }
        let machines: std::collections::BTreeSet<usize> =
            (0..1_600).map(|v| placement.owners(v)[0]).collect();
        assert_eq!(machines.len(), 5, "groups still spread over every slave");
    }

    #[test]
    fn a_block_is_read_from_one_replica_class_while_its_owners_are_up() {
        let placement = Placement {
            slaves: 4,
            replicas: 2,
            group: 1,
            pieces: Pieces::whole(),
        };
        for block in 0..8u64 {
            let vids = block * READ_BLOCK..(block + 1) * READ_BLOCK;
            let readers: Vec<usize> = vids
                .clone()
                .map(|v| placement.reader(v, |_| true).unwrap())
                .collect();
            // With 4 slaves in pairs (j, j+1), one class holds one of each pair.
            assert!(
                readers.iter().all(|r| r % 2 == (block % 2) as usize),
                "{readers:?}"
            );
            for v in vids {
                let reader = placement.reader(v, |s| s != 0).unwrap();
                assert!(placement.owners(v).contains(&reader) && reader != 0);
            }
        }
        assert_eq!(placement.reader(3, |_| false), None);
    }

    #[test]
    fn a_read_run_shares_its_owners_and_preferred_reader() {
        for (group, replicas) in [(1, 1), (4, 2), (64, 3), (1024, 2)] {
            let placement = Placement {
                slaves: 5,
                replicas,
                group,
                pieces: Pieces::whole(),
            };
            for vid in (0..5000u64).step_by(37).chain([u64::MAX - 3, u64::MAX]) {
                let run = placement.read_run(vid);
                assert!(run.contains(&vid));
                let width = group.min(READ_BLOCK);
                assert_eq!(
                    run.end() - run.start(),
                    width - 1,
                    "group {group}, vid {vid}"
                );
                assert_eq!(run.start() % width, 0);
                let owners = placement.owners(vid);
                let preferred = placement.preferred(&owners, vid, 0);
                for other in [*run.start(), *run.end()] {
                    assert_eq!(placement.owners(other), owners);
                    assert_eq!(placement.preferred(&owners, other, 0), preferred);
                }
                // With 3 replicas on 5 slaves a group may have no owner of
                // its vid's class: then the first owner reads it.
                let reader = placement.reader(vid, |_| true);
                assert_eq!(reader, preferred.or(Some(owners[0])));
                // Its preferred reader down, another owner reads it.
                let without = placement.reader(vid, |s| Some(s) != preferred);
                assert_eq!(without.is_some(), replicas > 1);
            }
        }
    }

    #[test]
    fn piece_zero_is_placed_as_a_whole_vector_and_other_pieces_on_their_own() {
        let pieces = Pieces::new(1 << 16).unwrap();
        let cut = Placement {
            slaves: 7,
            replicas: 2,
            group: 16,
            pieces,
        };
        let whole = Placement {
            pieces: Pieces::whole(),
            ..cut
        };
        for vid in [0, 5, 16, 4_000, crate::pieces::MAX_CUT_VID] {
            assert_eq!(cut.owners(vid), whole.owners(vid), "vid {vid}");
            // A group's piece shares its owners, as a group does.
            let first = vid - vid % 16;
            assert_eq!(
                cut.owners(pieces.key(vid, 9)),
                cut.owners(pieces.key(first, 9))
            );
            assert_eq!(
                cut.read_run(pieces.key(vid, 9)).start(),
                &pieces.key(first, 9)
            );
        }
        let machines: std::collections::BTreeSet<usize> =
            (0..64).map(|p| cut.owners(pieces.key(3, p))[0]).collect();
        assert_eq!(
            machines.len(),
            7,
            "the pieces of one vector spread over every slave"
        );
    }

    #[test]
    fn with_group_all_a_piece_of_every_vector_has_one_reader() {
        use crate::pieces::MAX_CUT_VID;
        let pieces = Pieces::new(1 << 20).unwrap();
        let placement = Placement {
            slaves: 4,
            replicas: 2,
            group: GROUP_ALL,
            pieces,
        };
        let mut readers = std::collections::BTreeSet::new();
        for piece in 0..16 {
            let first = placement.reader(pieces.key(0, piece), |_| true);
            for vid in [1, 255, 256, 70_000, MAX_CUT_VID] {
                let key = pieces.key(vid, piece);
                assert_eq!(
                    placement.owners(key),
                    placement.owners(pieces.key(0, piece))
                );
                assert_eq!(
                    placement.reader(key, |_| true),
                    first,
                    "piece {piece}, vid {vid}"
                );
            }
            let run = placement.read_run(pieces.key(300, piece));
            assert_eq!(run, pieces.key(0, piece)..=pieces.key(MAX_CUT_VID, piece));
            readers.insert(first.unwrap());
            // The next query's turn reads the piece from its other replica.
            let owners = placement.owners(pieces.key(0, piece));
            let next = placement.reader_among(&owners, pieces.key(9, piece), 1, |_| true);
            assert!(next.is_some() && next != first, "piece {piece}: {owners:?}");
        }
        assert_eq!(readers.len(), 4, "the pieces are read from every slave");
    }
}
