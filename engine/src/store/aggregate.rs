//! Range aggregates: per segment, the union of the vectors it holds in each
//! aligned block of vids, so that a run of many vids is read as a few
//! aggregates and a few single vectors.
//!
//! Blocks come in [`AGGREGATE_LEVELS`]: a block of level `l` is the
//! `AGGREGATE_LEVELS[l]` vids starting at a multiple of that width, and each
//! width divides the next, so blocks nest. Aggregates are per segment
//! because segments never change: an aggregate is exact for its segment
//! whatever is imported or merged later, and a vid's vector is the union of
//! its parts in every segment. So imports never rewrite an aggregate; a merge
//! writes fresh ones for the merged segment.
//!
//! A segment has the aggregate of a block when the vids it holds there fall
//! in at least two child blocks (two distinct vids at the lowest level):
//! otherwise the aggregate would repeat a child's aggregate or a single
//! vector, and cost space for nothing.
//!
//! [`Cover`] uses an aggregate only when the run asks for every vid the
//! segment holds in the block, so a vid the caller did not ask for is never
//! included: a handler covering its share of a term's vids stays exact when
//! another replica serves the rest.

use std::ops::Range;

use super::segment::Segment;
use crate::vector::VectorPart;

/// Widths of the aggregate blocks, in vids, lowest level first; each divides
/// the next. Why these widths is measured in benches/README.md ("Range
/// aggregates"): the lowest level costs the most space (about one dense
/// vector per block even when the vectors are sparse), the highest bounds
/// how many aggregates a wide run needs.
pub const AGGREGATE_LEVELS: [u64; 3] = [32, 256, 4096];

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

/// One aggregate a new segment gets: the block of level `level` starting at
/// vid `block`, whose vectors are `vids` (indexes into the segment's vids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) level: usize,
    pub(crate) block: u64,
    pub(crate) vids: Range<usize>,
}

/// The blocks that get an aggregate in a segment holding `vids` (ascending,
/// distinct): those whose vids fall in at least two child blocks.
pub(crate) fn blocks(vids: &[u64]) -> Vec<Block> {
    let mut blocks = Vec::new();
    for (level, &width) in AGGREGATE_LEVELS.iter().enumerate() {
        let child = level.checked_sub(1).map_or(1, |l| AGGREGATE_LEVELS[l]);
        let mut start = 0;
        for same in vids.chunk_by(|a, b| a / width == b / width) {
            let (first, last) = (same[0], same[same.len() - 1]);
            if first / child != last / child {
                blocks.push(Block {
                    level,
                    block: first - first % width,
                    vids: start..start + same.len(),
                });
            }
            start += same.len();
        }
    }
    blocks
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
}

impl<'s> Cover<'s> {
    fn push(&mut self, part: VectorPart<'s>, level: Option<usize>) {
        match level {
            Some(level) => self.stats.aggregates[level] += 1,
            None => self.stats.vectors += 1,
        }
        self.stats.bytes += part.byte_len();
        self.parts.push(part);
    }

    /// Adds the parts `segment` holds of `vids` (ascending, distinct).
    pub(crate) fn add_segment(&mut self, segment: &'s Segment, vids: &[u64]) {
        let held = 0..segment.vector_count();
        if segment.has_aggregates() {
            self.descend(segment, AGGREGATE_LEVELS.len(), vids, held);
        } else {
            self.singles(segment, vids, held);
        }
    }

    /// Covers `vids`, all in one block of level `above` (anywhere when
    /// `above` is the top), whose vectors in `segment` are the entries
    /// `held`: block by block of the level below, with the block's aggregate
    /// when `vids` holds every vid the segment has there, else one level
    /// further down. Cost: O(len(vids)) per level plus a binary search per
    /// block, whatever the width of the blocks.
    fn descend(&mut self, segment: &'s Segment, above: usize, vids: &[u64], held: Range<usize>) {
        let Some(level) = above.checked_sub(1) else {
            return self.singles(segment, vids, held);
        };
        let width = AGGREGATE_LEVELS[level];
        for run in vids.chunk_by(|a, b| a / width == b / width) {
            let block = run[0] - run[0] % width;
            let inside = segment.entries_between(held.clone(), block, block + (width - 1));
            if inside.is_empty() {
                continue;
            }
            if inside.len() >= 2
                && asks_for_all(segment, inside.clone(), run)
                && let Some(aggregate) = segment.aggregate(level, block)
            {
                self.push(aggregate, Some(level));
                continue;
            }
            self.descend(segment, level, run, inside);
        }
    }

    /// Adds the single parts of `vids` among the entries `held`.
    fn singles(&mut self, segment: &'s Segment, vids: &[u64], held: Range<usize>) {
        let mut from = held.start;
        for &vid in vids {
            let found = segment.entries_between(from..held.end, vid, vid);
            if !found.is_empty() {
                self.push(segment.part_at(found.start), None);
            }
            from = found.end;
        }
    }
}

/// Whether `run` (ascending) holds the vid of every entry of `held`
/// (ascending too). O(len(run)): no more than that many entries are looked at.
fn asks_for_all(segment: &Segment, held: Range<usize>, run: &[u64]) -> bool {
    if held.len() > run.len() {
        return false;
    }
    let mut asked = run.iter();
    held.into_iter()
        .all(|i| asked.any(|&vid| vid == segment.vid_at(i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_blocks_spanning_two_children_get_an_aggregate() {
        let at = |level, block, vids| Block { level, block, vids };
        // 0 and 1 share a level-0 block; 40 is alone in its level-0 block,
        // but with 0 and 1 it spans two children of the level-1 block 0.
        assert_eq!(blocks(&[0, 1, 40, 5000]), [at(0, 0, 0..2), at(1, 0, 0..3)]);
        assert_eq!(blocks(&[7]), []);
        assert_eq!(
            blocks(&[u64::MAX - 1, u64::MAX]),
            [at(0, u64::MAX - 31, 0..2)]
        );
        // Two vids a level-2 block apart share nothing.
        assert_eq!(blocks(&[0, 4096]), []);
    }

    #[test]
    fn entries_must_name_an_aligned_block_of_a_level() {
        assert_eq!(block_problem(0, 64), None);
        assert!(block_problem(1, 32).unwrap().contains("not aligned"));
        assert!(block_problem(3, 0).unwrap().contains("does not exist"));
    }
}
