//! Folds over vector parts: the union of many, the intersection of terms.
//!
//! A fold is *planned* first: the plan decides which output containers exist
//! and which of them are dense, and computes the small sparse ones. The
//! caller then allocates the dense words wherever the result must live (a
//! Cap'n Proto message being built, a `Vec`) and has the plan *fill* them in
//! place. This is what lets a handler OR vectors straight from its mmap and
//! from the incoming message into the outgoing message, with no copy between.
//!
//! Output parts hold at most [`PART_MAX_DENSE`] dense containers each, so
//! each fits one Cap'n Proto `Data`.
//!
//! Filling streams: input containers that are consecutive in memory and land
//! on consecutive output containers are folded as one long slice, the output
//! is processed 64 KiB at a time with the fused multi-source kernels,
//! and a large fold is split across cores with rayon.

mod intersection;
mod kept;
mod union;

pub use intersection::{IntersectionPlan, Term, intersection_count};
pub use kept::KeptWords;
pub use union::{UnionPlan, Unread};

use std::ops::Range;

use crate::vector::{CONTAINER_WORDS, PART_MAX_DENSE, VectorBuf, VectorPart};

/// Output words a fill works on at a time (64 KiB): big enough that each
/// input streams through the hardware prefetcher (short pieces interleaved
/// across many vectors read far slower from DRAM), small enough to keep the
/// output chunk in L2 while all inputs are folded into it. The measurements
/// are in benches/README.md, "Engine constants".
const CHUNK_WORDS: usize = 8 * CONTAINER_WORDS;

/// A fold is split across cores when it moves more than this many words
/// (32 MiB), input and output together: a second thread pays off for folds
/// read from DRAM, while for folds that fit in L3 waking it and merging cost
/// more than it saves (benches/README.md, "Engine constants").
const PARALLEL_WORDS: usize = 4 << 20;

/// Whether a fold moving `words` words should use more than one core.
fn parallel(words: usize) -> bool {
    words > PARALLEL_WORDS && rayon::current_num_threads() > 1
}

/// Into how many pieces to split the output of a fill writing `out_words`
/// words from `in_words` input words: 1 when small, else a few per core
/// (so that a core busy elsewhere does not hold the others up), each at
/// least one container.
fn task_count(out_words: usize, in_words: usize) -> usize {
    if !parallel(out_words + in_words) {
        return 1;
    }
    let threads = rayon::current_num_threads();
    let containers = out_words / CONTAINER_WORDS;
    out_words
        .div_ceil(CHUNK_WORDS)
        .clamp(threads, 4 * threads)
        .min(containers)
        .max(1)
}

/// One output part of a planned fold: its dense keys (to be filled) and its
/// sparse containers (already computed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlannedPart {
    dense_keys: Vec<u16>,
    sparse_keys: Vec<u16>,
    sparse_ends: Vec<u32>,
    sparse_values: Vec<u16>,
}

impl PlannedPart {
    /// Ascending keys of the output's dense containers.
    pub fn dense_keys(&self) -> &[u16] {
        &self.dense_keys
    }

    /// Number of words [`UnionPlan::fill`] or [`IntersectionPlan::fill`] writes for this part.
    pub fn dense_word_count(&self) -> usize {
        self.dense_keys.len() * CONTAINER_WORDS
    }

    /// Ascending keys of the output's sparse containers.
    pub fn sparse_keys(&self) -> &[u16] {
        &self.sparse_keys
    }

    /// End offsets of the sparse containers in [`PlannedPart::sparse_values`].
    pub fn sparse_ends(&self) -> &[u32] {
        &self.sparse_ends
    }

    /// Positions of the sparse containers, in key order.
    pub fn sparse_values(&self) -> &[u16] {
        &self.sparse_values
    }

    /// The finished part, once `dense_words` has been filled for it.
    pub fn with_words<'a>(&'a self, dense_words: &'a [u64]) -> VectorPart<'a> {
        VectorPart::from_verified(
            &self.dense_keys,
            dense_words,
            &self.sparse_keys,
            &self.sparse_ends,
            &self.sparse_values,
        )
    }

    fn push_sparse(&mut self, key: u16, values: &[u16]) {
        self.sparse_keys.push(key);
        self.sparse_values.extend_from_slice(values);
        self.sparse_ends.push(self.sparse_values.len() as u32);
    }
}

/// Splits planned containers into parts of at most [`PART_MAX_DENSE`] dense
/// containers: the dense container with global index `s` (in key order) goes
/// to part `s / PART_MAX_DENSE`, slot `s % PART_MAX_DENSE`.
struct PartSplitter {
    parts: Vec<PlannedPart>,
}

impl PartSplitter {
    fn new() -> Self {
        PartSplitter {
            parts: vec![PlannedPart::default()],
        }
    }

    fn current(&mut self) -> &mut PlannedPart {
        self.parts
            .last_mut()
            .expect("the splitter always holds a part")
    }

    /// Adds a dense container; returns the index of its part.
    fn dense(&mut self, key: u16) -> usize {
        if self.current().dense_keys.len() == PART_MAX_DENSE {
            self.parts.push(PlannedPart::default());
        }
        self.current().dense_keys.push(key);
        self.parts.len() - 1
    }

    fn sparse(&mut self, key: u16, values: &[u16]) {
        self.current().push_sparse(key, values);
    }

    fn finish(mut self) -> Vec<PlannedPart> {
        if self.parts.len() > 1 && *self.current() == PlannedPart::default() {
            self.parts.pop();
        }
        self.parts
    }
}

/// Checks a fill's arguments: `out` sized for `planned`, and as many
/// inputs as the plan was made from.
fn check_fill(planned: &PlannedPart, out: &[u64], inputs: usize, planned_inputs: usize) {
    assert_eq!(
        out.len(),
        planned.dense_word_count(),
        "output buffer has the wrong length"
    );
    assert_eq!(
        inputs, planned_inputs,
        "fill was given other inputs than the plan was made from"
    );
}

/// The vector parts of `parts` whose dense words were filled one part after
/// the other into the start of `words` ([`UnionPlan::fill_all`]).
pub fn filled_parts<'a>(
    parts: &'a [PlannedPart],
    words: &'a [u64],
) -> impl Iterator<Item = VectorPart<'a>> + 'a {
    parts
        .iter()
        .zip(word_ranges(parts))
        .map(|(planned, range)| planned.with_words(&words[range]))
}

/// Where the dense words of each of `parts` lie when they are filled one
/// part after the other into one buffer.
fn word_ranges(parts: &[PlannedPart]) -> impl Iterator<Item = Range<usize>> + '_ {
    parts.iter().scan(0, |at, planned| {
        let start = *at;
        *at += planned.dense_word_count();
        Some(start..*at)
    })
}

fn run_parts(parts: &[PlannedPart], fill: impl Fn(usize, &mut [u64])) -> Vec<VectorBuf> {
    parts
        .iter()
        .enumerate()
        .map(|(i, planned)| {
            let mut words = vec![0u64; planned.dense_word_count()];
            fill(i, &mut words);
            VectorBuf::from_part(planned.with_words(&words))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn bits_of(bufs: &[VectorBuf]) -> BTreeSet<u32> {
        bufs.iter().flat_map(|b| b.as_part().bits()).collect()
    }

    #[test]
    fn union_mixes_dense_and_sparse() {
        let a = VectorBuf::from_bits((0..1000).collect());
        let b = VectorBuf::from_bits(vec![5, 70_000, u32::MAX]);
        let inputs = [a.as_part(), b.as_part()];
        let plan = UnionPlan::new(&inputs);
        assert_eq!(plan.parts().len(), 1);
        assert_eq!(plan.parts()[0].dense_keys(), &[0]);
        assert_eq!(plan.parts()[0].sparse_keys(), &[1, u16::MAX]);
        let expected: BTreeSet<u32> = (0..1000).chain([70_000, u32::MAX]).collect();
        assert_eq!(bits_of(&plan.run(&inputs)), expected);
    }

    #[test]
    fn intersection_and_its_count_agree() {
        let a = VectorBuf::from_bits((0..5000).step_by(2).chain([1 << 20, 3 << 20]).collect());
        let b = VectorBuf::from_bits((0..5000).step_by(3).chain([3 << 20]).collect());
        let (pa, pb) = ([a.as_part()], [b.as_part()]);
        let terms = [Term::new(&pa).unwrap(), Term::new(&pb).unwrap()];
        let expected: BTreeSet<u32> = (0..5000).step_by(6).chain([3 << 20]).collect();
        let plan = IntersectionPlan::new(&terms);
        assert_eq!(bits_of(&plan.run(&terms)), expected);
        assert_eq!(intersection_count(&terms), expected.len() as u64);
    }

    #[test]
    fn term_rejects_overlapping_parts() {
        let a = VectorBuf::from_bits(vec![1, 1 << 20]);
        let b = VectorBuf::from_bits(vec![2 << 16]);
        let parts = [a.as_part(), b.as_part()];
        assert!(Term::new(&parts).is_err());
        assert!(Term::new(&parts[1..]).is_ok());
    }
}
