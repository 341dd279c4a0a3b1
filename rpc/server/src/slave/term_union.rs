//! A term's vector the coordinator keeps in memory for its own AND.
//!
//! In the fan-out plan the coordinator ORs each term's gathered partial
//! results with its own vectors, then ANDs the terms; in the chain plan a
//! term's chain may end on the coordinator. Written into a Cap'n Proto
//! message, each such term vector would cost a zeroed segment (Cap'n
//! Proto's allocator zeroes every one) and a copy into it, only to be read
//! back on the same machine. A [`TermUnion`] is the union's plan and its
//! dense words, filled once into a buffer this thread keeps between queries
//! ([`KeptWords`]).

use bitfold_engine::VectorPart;
use bitfold_engine::fold::{KeptWords, PlannedPart, UnionPlan, Unread, filled_parts};

/// Where a term's vector goes once its inputs are gathered: written into a
/// message (an [`EndTarget`](super::handler::EndTarget)), or kept here.
pub(crate) trait TermEnd {
    /// Takes the union `plan` of `inputs`; returns what its fill left
    /// unread of `inputs`, and the bytes of vector it holds.
    fn put(&mut self, plan: UnionPlan, inputs: &[VectorPart<'_>]) -> (Unread, u64);
}

impl<T: super::handler::EndTarget + ?Sized> TermEnd for T {
    fn put(&mut self, plan: UnionPlan, inputs: &[VectorPart<'_>]) -> (Unread, u64) {
        crate::wire::write_compact(|n| self.init_vector(n), &plan, inputs)
    }
}

/// A term's vector in memory: empty until [`TermEnd::put`]. Its buffer
/// goes back to the pool of the thread that drops it.
pub(crate) struct TermUnion {
    parts: Vec<PlannedPart>,
    words: KeptWords,
}

impl TermUnion {
    /// An empty term vector, with a buffer from this thread's pool.
    pub(crate) fn new() -> TermUnion {
        TermUnion {
            parts: Vec::new(),
            words: KeptWords::take(),
        }
    }

    /// The vector's parts, key-disjoint and ascending.
    pub(crate) fn views(&self) -> Vec<VectorPart<'_>> {
        filled_parts(&self.parts, &self.words).collect()
    }
}

impl TermEnd for TermUnion {
    fn put(&mut self, plan: UnionPlan, inputs: &[VectorPart<'_>]) -> (Unread, u64) {
        let unread = plan.fill_all(inputs, &mut self.words);
        let bytes = crate::wire::planned_bytes(plan.parts());
        self.parts = plan.into_parts();
        (unread, bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use bitfold_engine::VectorBuf;

    use super::*;

    fn bits(vector: &[VectorPart<'_>]) -> BTreeSet<u32> {
        vector.iter().flat_map(|part| part.bits()).collect()
    }

    /// Vectors of `n` bits each, at `stride` apart from `first`.
    fn vector(first: u32, stride: u32, n: u32) -> VectorBuf {
        VectorBuf::from_sorted_bits(&(0..n).map(|i| first + i * stride).collect::<Vec<_>>())
    }

    #[test]
    fn a_kept_term_is_the_union_of_its_inputs_query_after_query() {
        // Dense and sparse containers, overlapping keys; then a smaller
        // union into a reused buffer, which must not show the last one's words.
        let queries = [
            vec![
                vector(0, 3, 60_000),
                vector(1, 7, 30_000),
                vector(200_000, 11, 900),
            ],
            vec![vector(5, 2, 10_000), vector(70_000, 5, 100)],
            vec![vector(0, 1, 1)],
        ];
        let mut first_buffer = None;
        for inputs in &queries {
            let parts: Vec<VectorPart<'_>> = inputs.iter().map(VectorBuf::as_part).collect();
            let mut kept = TermUnion::new();
            let (unread, bytes) = kept.put(UnionPlan::new(&parts), &parts);
            let buffer = kept.words.as_ptr();
            assert_eq!(
                *first_buffer.get_or_insert(buffer),
                buffer,
                "one buffer serves every query"
            );
            assert_eq!(unread.total(), 0);
            let expected: BTreeSet<u32> = parts.iter().flat_map(|p| p.bits()).collect();
            assert_eq!(bits(&kept.views()), expected);
            assert!(bytes > 0);
        }
    }
}
