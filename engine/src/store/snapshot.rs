//! [`Snapshot`]: a consistent view of a store's segments, and the reads that
//! resolve each vid's records, newest first, into its vector.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use super::aggregate::Cover;
use super::segment::{RecordKind, Segment};
use crate::vector::VectorPart;

/// A consistent, immutable view of a store: the segments live when it was
/// taken, oldest first. Holding it keeps their maps alive.
///
/// A vid's vector is read from its records newest first: `set` records add
/// their bits, a `base` record adds its bits and ends the walk, a `deleted`
/// record ends it with nothing more (and, as the newest record, means the
/// vector does not exist).
pub struct Snapshot {
    pub(super) segments: Vec<Arc<Segment>>,
    vector_count: OnceLock<u64>,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("segments", &self.segments)
            .finish()
    }
}

impl Snapshot {
    pub(super) fn new(segments: Vec<Arc<Segment>>) -> Snapshot {
        Snapshot {
            segments,
            vector_count: OnceLock::new(),
        }
    }

    /// The parts whose union is vector `vid`: none if it does not exist or
    /// is empty (tell the two apart with [`Snapshot::contains`]).
    pub fn parts(&self, vid: u64) -> impl Iterator<Item = VectorPart<'_>> + '_ {
        let mut ended = false;
        self.segments
            .iter()
            .rev()
            .filter_map(move |s| s.record(vid))
            .map_while(move |(kind, part)| {
                if ended {
                    return None;
                }
                ended = kind.ends_chain();
                (kind != RecordKind::Deleted).then_some(part)
            })
            .filter(|part| !part.is_empty())
    }

    /// Parts whose union is exactly the union of the vectors `vids`
    /// (ascending, distinct; vids not held add nothing), using range
    /// aggregates where they save reads.
    ///
    /// Segments are read newest first. In each, an aggregate of a block is
    /// used only when `vids` holds every vid the segment has in the block
    /// and no newer segment ended one of those vids' chains (a `base` or
    /// `deleted` record: the aggregate may hold bits since cleared), so the
    /// union never includes a bit that was not asked for; otherwise the
    /// block is covered by the level below, and at the bottom by single
    /// vector parts. An aggregate of a segment written by an update covers
    /// the older segments' vectors of its block too, which are then not
    /// read. The cost of choosing is O(len(vids)) per level and segment,
    /// not the width of the blocks. The parts come widest first: a union
    /// reading them in order stops soonest where their OR is all ones.
    ///
    /// # Panics
    ///
    /// If `vids` is not strictly ascending.
    pub fn cover(&self, vids: &[u64]) -> Cover<'_> {
        assert!(
            vids.windows(2).all(|w| w[0] < w[1]),
            "Snapshot::cover takes vids strictly ascending"
        );
        let mut cover = Cover::default();
        let mut wanted = vids.to_vec();
        for segment in self.segments.iter().rev() {
            if wanted.is_empty() {
                break;
            }
            let settled = cover.add_segment(segment, &wanted[segment.span_of(&wanted)]);
            remove_settled(&mut wanted, settled);
            if segment.ends_chains() {
                wanted.retain(|&vid| !segment.kind(vid).is_some_and(RecordKind::ends_chain));
            }
        }
        cover.widest_first();
        cover
    }

    /// Whether vector `vid` exists.
    pub fn contains(&self, vid: u64) -> bool {
        self.segments
            .iter()
            .rev()
            .find_map(|s| s.kind(vid))
            .is_some_and(|kind| kind != RecordKind::Deleted)
    }

    /// The smallest of `vids` (ascending, distinct) that does not exist, if
    /// any: [`Snapshot::contains`] for many vids at once, one ascending walk
    /// of each segment's index instead of a search per vid and segment.
    ///
    /// # Panics
    ///
    /// If `vids` is not strictly ascending.
    pub fn first_missing(&self, vids: &[u64]) -> Option<u64> {
        assert!(
            vids.windows(2).all(|w| w[0] < w[1]),
            "Snapshot::first_missing takes vids strictly ascending"
        );
        let mut unresolved = vids.to_vec();
        let mut missing = None;
        for segment in self.segments.iter().rev() {
            if unresolved.is_empty() {
                break;
            }
            // Only the vids within the segment's own range are looked up.
            let within = segment.span_of(&unresolved);
            let mut kept = Vec::new();
            let count = segment.vector_count();
            segment.find_ascending(
                0..count,
                &unresolved[within.clone()],
                |vid, found| match found {
                    None => kept.push(vid),
                    Some(i) if segment.kind_at(i) == RecordKind::Deleted => {
                        missing = Some(missing.map_or(vid, |m: u64| m.min(vid)));
                    }
                    Some(_) => {}
                },
            );
            unresolved.splice(within, kept);
        }
        let never_stored = unresolved.first().copied();
        missing.into_iter().chain(never_stored).min()
    }

    /// Every vid held, ascending.
    pub fn vids(&self) -> impl Iterator<Item = u64> + '_ {
        self.vids_from(0)
    }

    /// Every vid held from `first` on, ascending.
    pub(super) fn vids_from(&self, first: u64) -> impl Iterator<Item = u64> + '_ {
        let mut merge = VidMerge::starting_at(&self.segments, first);
        let mut hits = Vec::new();
        std::iter::from_fn(move || {
            loop {
                let vid = merge.next_group(&mut hits)?;
                if self.exists(&hits) {
                    return Some(vid);
                }
            }
        })
    }

    /// Whether the vid whose records are `hits` (segment, entry) exists:
    /// whether its newest record is not `deleted`.
    fn exists(&self, hits: &[(usize, usize)]) -> bool {
        hits.iter()
            .max()
            .is_some_and(|&(s, i)| self.segments[s].kind_at(i) != RecordKind::Deleted)
    }

    /// Number of vectors held.
    pub fn vector_count(&self) -> u64 {
        *self.vector_count.get_or_init(|| match &self.segments[..] {
            [only] => only.existing_count() as u64,
            _ => self.vids().count() as u64,
        })
    }

    /// Bytes of the live data files.
    pub fn byte_size(&self) -> u64 {
        self.segments.iter().map(|s| s.len()).sum()
    }

    /// Number of live segment files (each one memory map).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

/// Removes from `wanted` (ascending) every vid inside one of the `settled`
/// ranges (ascending and disjoint).
fn remove_settled(wanted: &mut Vec<u64>, settled: Vec<Range<u64>>) {
    if settled.is_empty() {
        return;
    }
    debug_assert!(settled.windows(2).all(|w| w[0].end <= w[1].start));
    let mut ranges = settled.iter().peekable();
    wanted.retain(|&vid| {
        while ranges.next_if(|range| range.end <= vid).is_some() {}
        ranges.peek().is_none_or(|range| !range.contains(&vid))
    });
}

/// Walks the indexes of several segments together in ascending vid order.
pub(super) struct VidMerge<'s> {
    segments: &'s [Arc<Segment>],
    /// (vid, segment, entry) of each segment's next entry.
    heads: BinaryHeap<Reverse<(u64, usize, usize)>>,
}

impl<'s> VidMerge<'s> {
    pub(super) fn new(segments: &'s [Arc<Segment>]) -> Self {
        VidMerge::starting_at(segments, 0)
    }

    /// The walk from vid `first` on.
    fn starting_at(segments: &'s [Arc<Segment>], first: u64) -> Self {
        let mut merge = VidMerge {
            segments,
            heads: BinaryHeap::with_capacity(segments.len()),
        };
        for (s, segment) in segments.iter().enumerate() {
            let held = 0..segment.vector_count();
            merge.push(s, segment.entries_between(held, first, u64::MAX).start);
        }
        merge
    }

    fn push(&mut self, segment: usize, entry: usize) {
        if entry < self.segments[segment].vector_count() {
            let vid = self.segments[segment].vid_at(entry);
            self.heads.push(Reverse((vid, segment, entry)));
        }
    }

    /// The next vid; `hits` receives the (segment, entry) pairs holding it.
    pub(super) fn next_group(&mut self, hits: &mut Vec<(usize, usize)>) -> Option<u64> {
        let Reverse((vid, _, _)) = *self.heads.peek()?;
        hits.clear();
        while let Some(&Reverse((next, segment, entry))) = self.heads.peek() {
            if next != vid {
                break;
            }
            self.heads.pop();
            hits.push((segment, entry));
            self.push(segment, entry + 1);
        }
        Some(vid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_ranges_remove_exactly_their_vids() {
        let mut wanted: Vec<u64> = (0..40).collect();
        remove_settled(&mut wanted, vec![3..4, 16..32, 39..40]);
        let expected: Vec<u64> = (0..3).chain(4..16).chain(32..39).collect();
        assert_eq!(wanted, expected);
    }
}
