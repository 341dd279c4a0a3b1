//! Range aggregates: per segment, the union of the vectors it holds in each
//! aligned block of vids, so that a run of many vids is read as a few
//! aggregates and a few single vectors.
//!
//! Blocks come in [`AGGREGATE_LEVELS`]: a block of level `l` is the
//! `AGGREGATE_LEVELS[l]` vids starting at a multiple of that width, and each
//! width divides the next, so blocks nest. Aggregates are per segment
//! because segments never change: an aggregate is exact for its segment
//! whatever is imported or merged later. So imports never rewrite an
//! aggregate; a merge writes fresh ones for the merged segment. An update
//! (a `base` or `deleted` record) makes the older aggregates of its blocks
//! stale, since they may hold bits it removed: a cover does not use them,
//! and the update segment carries aggregates rebuilt for those blocks that
//! stand for the older segments too (see `update.rs`).
//!
//! A segment has the aggregate of a block when the vids it holds there fall
//! in at least two child blocks (two distinct vids at the lowest level),
//! otherwise the aggregate would repeat a child's aggregate or a single
//! vector; and when it is small enough next to the vectors it replaces
//! (see `budget`), which bounds the space they take.
//!
//! [`Cover`] uses an aggregate only when the run asks for every vid the
//! segment holds in the block (but those it deletes), so a vid the caller
//! did not ask for is never included: a handler covering its share of a
//! term's vids stays exact when another replica serves the rest.

use std::ops::Range;

use super::StoreError;
use super::segment::{RecordKind, Segment, SegmentWriter};
use crate::fold::{PlannedPart, UnionPlan};
use crate::runs::{self, VidRun};
use crate::vector::{CONTAINER_WORDS, VectorBuf, VectorPart};

/// Widths of the aggregate blocks, in vids, lowest level first; each divides
/// the next. They are part of segment format version 4 (an aggregate entry
/// names its level, not its width): other widths need a new version.
/// Versions 2 and 3 had no 4-vid level: their segments' levels are read as
/// one higher.
///
/// Why these widths is measured in
/// benches/runs/2026-11-30-range-aggregates.md:
/// the lowest level costs the most space (up to one dense vector per block)
/// and bounds the single vectors an unaligned run needs (up to 2 × 3); the
/// highest bounds how many aggregates a wide run needs.
pub const AGGREGATE_LEVELS: [u64; 4] = [4, 16, 256, 4096];

// A cover splits vids into blocks with a mask, not a division per vid.
const _: () = {
    let mut level = 0;
    while level < AGGREGATE_LEVELS.len() {
        assert!(AGGREGATE_LEVELS[level].is_power_of_two());
        level += 1;
    }
};

/// What to add to the level of an aggregate entry of a segment of format
/// version 2 or 3, whose levels were 16, 256 and 4,096 vids, to get its
/// index in [`AGGREGATE_LEVELS`].
pub(crate) const OLD_LEVEL_SHIFT: u32 = 1;

/// What is wrong with an aggregate entry of level `level` for the block
/// starting at `block`, if anything.
pub(crate) fn block_problem(level: u32, block: u64) -> Option<String> {
    match AGGREGATE_LEVELS.get(level as usize) {
        None => Some(format!(
            "level {level} does not exist (there are {})",
            AGGREGATE_LEVELS.len()
        )),
        Some(width) if !block.is_multiple_of(*width) => Some(format!(
            "block {block} is not aligned to its level's width {width}"
        )),
        Some(_) => None,
    }
}

/// Largest union (in bytes, bounded by the key span of its inputs) that
/// writing aggregates holds in memory to build the block above from it. A
/// block whose union may be larger is built from its vectors' parts,
/// streamed, like a merge: one more pass over the data, but never a huge
/// vector held. At this size at most 16 + 16 + 4 unions (36 × 4 MiB, one
/// per child block of the three levels above the lowest) are held at once.
const HELD_MAX: u64 = 4 << 20;

/// Writes the aggregates of a new segment holding `vids` (ascending,
/// distinct); `parts_of(range)` yields the parts the segment's vectors
/// `vids[range]` are the union of.
///
/// Block by block of the top level, depth first: a block's aggregate is the
/// union of its children's aggregates (or of the parts of a child that has
/// none), so the data is read about once whatever the number of levels,
/// rather than once per level.
///
/// Imports write their segment's aggregates too, so that a store that is
/// never merged still has them: reading the batch once more from memory
/// costs little next to writing and syncing it
/// (benches/runs/2026-11-30-range-aggregates.md measures imports with and
/// without).
pub(crate) fn write<'p, I>(
    writer: &mut SegmentWriter,
    vids: &[u64],
    parts_of: impl Fn(Range<usize>) -> I,
) -> Result<(), StoreError>
where
    I: Iterator<Item = VectorPart<'p>>,
{
    let top = AGGREGATE_LEVELS.len() - 1;
    for range in blocks(vids, 0..vids.len(), AGGREGATE_LEVELS[top]) {
        write_block(writer, top, vids, range, &parts_of)?;
    }
    Ok(())
}

/// The ranges of `vids[within]` falling in the same block of `width` vids.
fn blocks(vids: &[u64], within: Range<usize>, width: u64) -> Vec<Range<usize>> {
    let mut start = within.start;
    vids[within]
        .chunk_by(|a, b| a / width == b / width)
        .map(|same| {
            start += same.len();
            start - same.len()..start
        })
        .collect()
}

/// Writes the aggregates of the block of level `level` holding the vids
/// `vids[range]`, and of the blocks inside it. Returns the block's union
/// when it is held in memory, `None` when the caller must use the parts of
/// `vids[range]` instead.
fn write_block<'p, I>(
    writer: &mut SegmentWriter,
    level: usize,
    vids: &[u64],
    range: Range<usize>,
    parts_of: &impl Fn(Range<usize>) -> I,
) -> Result<Option<Vec<VectorBuf>>, StoreError>
where
    I: Iterator<Item = VectorPart<'p>>,
{
    let child_width = level.checked_sub(1).map_or(1, |l| AGGREGATE_LEVELS[l]);
    let children = blocks(vids, range.clone(), child_width);
    let below = |writer: &mut SegmentWriter, child: Range<usize>| match level.checked_sub(1) {
        Some(child_level) => write_block(writer, child_level, vids, child, parts_of),
        None => Ok(None),
    };
    if let [only] = &children[..] {
        // The aggregate would repeat the child's.
        return below(writer, only.clone());
    }
    let block = vids[range.start] - vids[range.start] % AGGREGATE_LEVELS[level];
    let budget = budget(level, parts_of(range.clone()));
    if union_bound(parts_of(range.clone())) > HELD_MAX {
        for child in children {
            below(writer, child)?;
        }
        let parts: Vec<VectorPart<'p>> = parts_of(range).collect();
        let planned: u64 = UnionPlan::new(&parts)
            .parts()
            .iter()
            .map(planned_bytes)
            .sum();
        if planned <= budget {
            writer.add_aggregate(level, block, &parts)?;
        }
        return Ok(None);
    }
    let mut held = Vec::with_capacity(children.len());
    for child in &children {
        held.push(below(writer, child.clone())?);
    }
    let mut inputs: Vec<VectorPart<'_>> = Vec::new();
    for (child, union) in children.into_iter().zip(&held) {
        match union {
            Some(union) => inputs.extend(union.iter().map(VectorBuf::as_part)),
            None => {
                for part in parts_of(child) {
                    inputs.push(part);
                }
            }
        }
    }
    let union = UnionPlan::new(&inputs).run(&inputs);
    let parts: Vec<VectorPart<'_>> = union.iter().map(VectorBuf::as_part).collect();
    if parts.iter().map(VectorPart::byte_len).sum::<u64>() <= budget {
        writer.add_aggregate(level, block, &parts)?;
    }
    // Even when not written, the union saves the block above a read.
    Ok(Some(union))
}

/// The most bytes the aggregate of level `level` of a block whose vectors
/// are the union of `parts` may take: their bytes divided by
/// `BUDGET_DIVISORS[level]`. An aggregate over that is not written (a cover
/// then reads the level below), so an aggregate reads at most half of what
/// it replaces at the lowest level and a quarter above. Without this, the
/// union of 16 small sparse vectors, dense once it holds over
/// [`crate::SPARSE_MAX`] bits in a container, could take more space than
/// they do.
fn budget<'p>(level: usize, parts: impl Iterator<Item = VectorPart<'p>>) -> u64 {
    parts.map(|part| part.byte_len()).sum::<u64>() / BUDGET_DIVISORS[level]
}

/// Per level, what [`budget`] divides the bytes of a block's vectors by.
///
/// A block's aggregate is written when the segment holds enough of the
/// block's vectors: with dense vectors (a union about one vector's size)
/// 2 of a 4-vid block, 4 of a 16-vid block, 16 of a 256-vid block, 64 of a
/// 4,096-vid block. So a slave holding a quarter of every block (placement
/// groups of one vid, four slaves) or a segment holding a few hundred vids
/// still gets aggregates above the lowest level, and the union of four
/// dense vectors whose sparse containers differ (a few bytes over a
/// quarter of theirs) is still written. The aggregates take at most
/// 1/2 + 1/4 + 1/16 + 1/64 of the bytes of the parts they were written
/// from, near that only for contrived vectors (identical in pairs,
/// disjoint across pairs, and so on up); for dense vectors held whole the
/// 4-vid level takes 1/4 and the others 1/16 + 1/256 + 1/4,096
/// (benches/runs/2026-11-30-range-aggregates.md).
const BUDGET_DIVISORS: [u64; AGGREGATE_LEVELS.len()] = [2, 4, 16, 64];

/// Bytes of a planned union part, as [`VectorPart::byte_len`] counts them.
fn planned_bytes(part: &PlannedPart) -> u64 {
    (part.dense_word_count() * 8
        + size_of_val(part.dense_keys())
        + size_of_val(part.sparse_keys())
        + size_of_val(part.sparse_ends())
        + size_of_val(part.sparse_values())) as u64
}

/// An upper bound of the bytes of the union of `parts`: every container
/// between the smallest and the largest key, dense.
fn union_bound<'p>(parts: impl Iterator<Item = VectorPart<'p>>) -> u64 {
    let span = parts
        .filter_map(|part| part.key_range())
        .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)));
    span.map_or(0, |(lo, hi)| {
        (u64::from(hi - lo) + 1) * (CONTAINER_WORDS * 8 + 2) as u64
    })
}

/// What a [`Cover`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoverStats {
    /// Aggregates used, per level of [`AGGREGATE_LEVELS`].
    pub aggregates: [u64; AGGREGATE_LEVELS.len()],
    /// Single vector parts used.
    pub vectors: u64,
    /// Bytes of every part used (words, keys, ends and values): what a
    /// union of them reads.
    pub bytes: u64,
}

/// Parts whose union is the union of a run of vectors: see
/// [`super::Snapshot::cover`].
#[derive(Debug, Clone, Default)]
pub struct Cover<'s> {
    /// The parts: aggregates and single vector parts, from every segment.
    pub parts: Vec<VectorPart<'s>>,
    /// What they are and what they cost.
    pub stats: CoverStats,
    /// Per part: 1 + its level, 0 for a single vector.
    ranks: Vec<u8>,
}

impl<'s> Cover<'s> {
    fn push(&mut self, part: VectorPart<'s>, level: Option<usize>) {
        match level {
            Some(level) => self.stats.aggregates[level] += 1,
            None => self.stats.vectors += 1,
        }
        self.stats.bytes += part.byte_len();
        self.parts.push(part);
        self.ranks.push(level.map_or(0, |level| level as u8 + 1));
    }

    /// Orders the parts widest first (the aggregates of the widest level
    /// down to single vectors), keeping their order otherwise: a union
    /// reads them in this order and stops where their OR is all ones, which
    /// a few wide aggregates reach soonest.
    pub(crate) fn widest_first(&mut self) {
        let mut ranked: Vec<(u8, VectorPart<'s>)> =
            self.ranks.drain(..).zip(self.parts.drain(..)).collect();
        ranked.sort_by_key(|&(rank, _)| std::cmp::Reverse(rank));
        for (rank, part) in ranked {
            self.ranks.push(rank);
            self.parts.push(part);
        }
    }

    /// Adds the parts `segment` holds of the vids of `runs` (ascending,
    /// disjoint; none of them has a chain ended by a newer segment).
    /// Returns the blocks whose vectors an aggregate covering older
    /// segments answered (see [`Segment::covers_older`]): older segments
    /// must add nothing there (ascending, disjoint).
    pub(crate) fn add_segment(&mut self, segment: &'s Segment, runs: &[VidRun]) -> Vec<VidRun> {
        let held = 0..segment.vector_count();
        let mut settled = Vec::new();
        if segment.has_aggregates() {
            self.descend(segment, AGGREGATE_LEVELS.len(), runs, held, &mut settled);
        } else {
            self.singles(segment, runs, held);
        }
        settled
    }

    /// Covers the vids of `runs`, all in one block of level `above`
    /// (anywhere when `above` is the top), whose vectors in `segment` are
    /// the entries `held`: block by block of the level below, with the
    /// block's aggregate when `runs` hold every vid the segment has there,
    /// else one level further down. Blocks where the segment holds nothing
    /// are skipped with one search; the cost is a few searches per block
    /// that holds vectors, whatever the number of vids.
    fn descend(
        &mut self,
        segment: &'s Segment,
        above: usize,
        runs: &[VidRun],
        mut held: Range<usize>,
        settled: &mut Vec<VidRun>,
    ) {
        let Some(level) = above.checked_sub(1) else {
            return self.singles(segment, runs, held);
        };
        let width = AGGREGATE_LEVELS[level];
        let mut pieces: Vec<VidRun> = Vec::new();
        let mut i = 0;
        let mut from = runs.first().map_or(0, |run| run.first);
        while i < runs.len() {
            let start = from & !(width - 1);
            let block = VidRun {
                first: start,
                last: start + (width - 1),
            };
            // The runs' vids in this block, from `from` on.
            pieces.clear();
            while i < runs.len() && runs[i].first <= block.last {
                let first = runs[i].first.max(from);
                if runs[i].last <= block.last {
                    pieces.push(VidRun {
                        first,
                        last: runs[i].last,
                    });
                    i += 1;
                } else {
                    pieces.push(VidRun {
                        first,
                        last: block.last,
                    });
                    break;
                }
            }
            let inside = segment.entries_between(held.clone(), block.first, block.last);
            if !inside.is_empty() {
                if inside.len() >= 2
                    && asks_for_all(segment, inside.clone(), block, &pieces)
                    && let Some(aggregate) = segment.aggregate(level, block.first)
                {
                    self.push(aggregate, Some(level));
                    if segment.covers_older() {
                        settled.push(block);
                    }
                } else {
                    self.descend(segment, level, &pieces, inside.clone(), settled);
                }
            }
            // On to the next block holding both vids asked for and entries;
            // the blocks ascend, so the entries before it are done with.
            let Some(next) = block.last.checked_add(1) else {
                break;
            };
            held.start = inside.end;
            if held.is_empty() {
                break;
            }
            let next = next.max(segment.vid_at(held.start));
            while i < runs.len() && runs[i].last < next {
                i += 1;
            }
            if let Some(run) = runs.get(i) {
                from = run.first.max(next);
            }
        }
    }

    /// Adds the single parts of the vids of `runs` among the entries `held`
    /// (`deleted` and `keep` records and empty `base` ones have none).
    fn singles(&mut self, segment: &'s Segment, runs: &[VidRun], mut held: Range<usize>) {
        for run in runs {
            let found = segment.entries_between(held.clone(), run.first, run.last);
            // The runs ascend: the next one's entries come after these.
            held.start = found.end;
            for i in found {
                let part = segment.part_at(i);
                if !part.is_empty() {
                    self.push(part, None);
                }
            }
        }
    }
}

/// Whether `pieces` (ascending runs within `block`) hold the vid of every
/// entry of `inside` (the segment's entries in `block`) but the `deleted`
/// ones, which add nothing to an aggregate: a search of the index per gap
/// between the pieces.
fn asks_for_all(segment: &Segment, inside: Range<usize>, block: VidRun, pieces: &[VidRun]) -> bool {
    let deletes = segment.has_deletes();
    let mut gaps = runs::subtract(&[block], pieces).into_iter();
    gaps.all(|gap| {
        let entries = segment.entries_between(inside.clone(), gap.first, gap.last);
        // A record's kind is decoded only in a segment that has deletes.
        entries.is_empty()
            || (deletes
                && entries
                    .into_iter()
                    .all(|i| segment.kind_at(i) == RecordKind::Deleted))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_must_name_an_aligned_block_of_a_level() {
        assert_eq!(block_problem(0, 64), None);
        assert_eq!(block_problem(1, 32), None);
        assert!(block_problem(2, 32).unwrap().contains("not aligned"));
        assert!(block_problem(4, 0).unwrap().contains("does not exist"));
    }
}
