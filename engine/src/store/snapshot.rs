//! [`Snapshot`]: a consistent view of a store's segments, and the reads that
//! resolve each vid's records, newest first, into its vector.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use super::aggregate::Cover;
use super::segment::{RecordKind, Segment};
use crate::runs::{self, VidRun};
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
    /// (ascending, distinct; vids not held add nothing): [`Snapshot::cover_runs`]
    /// of their runs.
    ///
    /// # Panics
    ///
    /// If `vids` is not strictly ascending.
    pub fn cover(&self, vids: &[u64]) -> Cover<'_> {
        assert!(
            vids.windows(2).all(|w| w[0] < w[1]),
            "Snapshot::cover takes vids strictly ascending"
        );
        self.cover_runs(&VidRun::runs_of(vids))
    }

    /// Parts whose union is exactly the union of the vectors of `runs`
    /// (ascending, disjoint; vids not held add nothing), using range
    /// aggregates where they save reads.
    ///
    /// Segments are read newest first. In each, an aggregate of a block is
    /// used only when `runs` hold every vid the segment has in the block
    /// and no newer segment ended one of those vids' chains (a `base` or
    /// `deleted` record: the aggregate may hold bits since cleared), so the
    /// union never includes a bit that was not asked for; otherwise the
    /// block is covered by the level below, and at the bottom by single
    /// vector parts. An aggregate of a segment written by an update covers
    /// the older segments' vectors of its block too, which are then not
    /// read. The cost of choosing is a few searches of the segment's index
    /// per run and block touched, and per stretch of vids it holds there,
    /// not the number of vids. The parts come widest first: a union
    /// reading them in order stops soonest where their OR is all ones.
    ///
    /// # Panics
    ///
    /// If `runs` do not ascend, each after the one before.
    pub fn cover_runs(&self, runs: &[VidRun]) -> Cover<'_> {
        assert!(
            runs::ascending(runs),
            "Snapshot::cover_runs takes runs ascending and disjoint"
        );
        let mut cover = Cover::default();
        let mut wanted = runs.to_vec();
        for segment in self.segments.iter().rev() {
            if wanted.is_empty() {
                break;
            }
            let settled = cover.add_segment(segment, &wanted);
            wanted = runs::subtract(&wanted, &settled);
            if segment.ends_chains() {
                let ended = chain_ends(segment, &wanted);
                wanted = runs::subtract(&wanted, &ended);
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
    /// any: [`Snapshot::first_missing_in`] their runs.
    ///
    /// # Panics
    ///
    /// If `vids` is not strictly ascending.
    pub fn first_missing(&self, vids: &[u64]) -> Option<u64> {
        assert!(
            vids.windows(2).all(|w| w[0] < w[1]),
            "Snapshot::first_missing takes vids strictly ascending"
        );
        self.first_missing_in(&VidRun::runs_of(vids))
    }

    /// The smallest vid of `runs` (ascending, disjoint) that does not exist,
    /// if any: [`Snapshot::contains`] for many vids at once, a few searches
    /// of each segment's index per run and per stretch of consecutive vids
    /// it holds, instead of a search per vid and segment.
    ///
    /// # Panics
    ///
    /// If `runs` do not ascend, each after the one before.
    pub fn first_missing_in(&self, runs: &[VidRun]) -> Option<u64> {
        assert!(
            runs::ascending(runs),
            "Snapshot::first_missing_in takes runs ascending and disjoint"
        );
        let mut unresolved = runs.to_vec();
        let mut missing: Option<u64> = None;
        for segment in self.segments.iter().rev() {
            if unresolved.is_empty() {
                break;
            }
            let deletes = segment.has_deletes();
            let all = 0..segment.vector_count();
            let mut found = Vec::new();
            for run in &unresolved {
                for (entries, stretch) in segment.stretches(all.clone(), run.first, run.last) {
                    if deletes
                        && let Some(i) = entries
                            .into_iter()
                            .find(|&i| segment.kind_at(i) == RecordKind::Deleted)
                    {
                        let vid = segment.vid_at(i);
                        missing = Some(missing.map_or(vid, |m| m.min(vid)));
                    }
                    found.push(stretch);
                }
            }
            unresolved = runs::subtract(&unresolved, &found);
        }
        let never_stored = unresolved.first().map(|run| run.first);
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

/// The vids of `runs` (ascending, disjoint) whose record in `segment` ends
/// their chain (`base` or `deleted`), as runs: older segments add nothing
/// to them.
fn chain_ends(segment: &Segment, runs: &[VidRun]) -> Vec<VidRun> {
    let all = 0..segment.vector_count();
    let mut ended: Vec<u64> = Vec::new();
    for run in runs {
        for (entries, _) in segment.stretches(all.clone(), run.first, run.last) {
            ended.extend(
                entries
                    .filter(|&i| segment.kind_at(i).ends_chain())
                    .map(|i| segment.vid_at(i)),
            );
        }
    }
    VidRun::runs_of(&ended)
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
            merge.push(s, segment.first_entry_from(held, first));
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
