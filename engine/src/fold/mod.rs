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

use crate::kernels;
use crate::vector::{
    CONTAINER_WORDS, ContainerRef, MalformedPart, PART_MAX_DENSE, SPARSE_MAX, VectorBuf, VectorPart,
};

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

/// Splits planned containers into parts of at most [`PART_MAX_DENSE`] dense containers.
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

    fn dense(&mut self, key: u16) {
        if self.current().dense_keys.len() == PART_MAX_DENSE {
            self.parts.push(PlannedPart::default());
        }
        self.current().dense_keys.push(key);
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

/// The plan of a union (OR) of any number of parts, in any order, overlapping or not.
#[derive(Debug, Clone)]
pub struct UnionPlan {
    parts: Vec<PlannedPart>,
}

impl UnionPlan {
    /// Plans the union of `inputs`. An output container is dense where any
    /// input is dense or the sparse inputs hold more than [`SPARSE_MAX`] bits.
    pub fn new(inputs: &[VectorPart<'_>]) -> UnionPlan {
        let mut containers: Vec<(u16, ContainerRef<'_>)> =
            inputs.iter().flat_map(|part| part.containers()).collect();
        containers.sort_by_key(|&(key, _)| key);
        let mut splitter = PartSplitter::new();
        let mut merged = Vec::new();
        for group in containers.chunk_by(|a, b| a.0 == b.0) {
            let key = group[0].0;
            let any_dense = group
                .iter()
                .any(|(_, c)| matches!(c, ContainerRef::Dense(_)));
            let sparse_bits: usize = group
                .iter()
                .map(|(_, c)| match c {
                    ContainerRef::Sparse(values) => values.len(),
                    ContainerRef::Dense(_) => 0,
                })
                .sum();
            if any_dense || sparse_bits > SPARSE_MAX {
                splitter.dense(key);
                continue;
            }
            merged.clear();
            for (_, container) in group {
                if let ContainerRef::Sparse(values) = container {
                    merged.extend_from_slice(values);
                }
            }
            merged.sort_unstable();
            merged.dedup();
            splitter.sparse(key, &merged);
        }
        UnionPlan {
            parts: splitter.finish(),
        }
    }

    /// The output parts, key-disjoint and ascending.
    pub fn parts(&self) -> &[PlannedPart] {
        &self.parts
    }

    /// Writes the dense containers of output part `part` into `out`, which
    /// must hold exactly [`PlannedPart::dense_word_count`] words (anything in
    /// it is overwritten). `inputs` must be the parts the plan was made from.
    ///
    /// # Panics
    ///
    /// If `out` has the wrong length.
    pub fn fill(&self, part: usize, inputs: &[VectorPart<'_>], out: &mut [u64]) {
        let planned = &self.parts[part];
        assert_eq!(
            out.len(),
            planned.dense_word_count(),
            "output buffer has the wrong length"
        );
        out.fill(0);
        for input in inputs {
            for (key, container) in input.containers() {
                let Ok(slot) = planned.dense_keys.binary_search(&key) else {
                    continue;
                };
                let target = &mut out[slot * CONTAINER_WORDS..(slot + 1) * CONTAINER_WORDS];
                match container {
                    ContainerRef::Dense(words) => kernels::or_into(target, &words[..]),
                    ContainerRef::Sparse(values) => set_positions(target, values),
                }
            }
        }
    }

    /// Runs the whole fold into owned vectors, one per output part.
    pub fn run(&self, inputs: &[VectorPart<'_>]) -> Vec<VectorBuf> {
        self.parts
            .iter()
            .enumerate()
            .map(|(i, planned)| {
                let mut words = vec![0u64; planned.dense_word_count()];
                self.fill(i, inputs, &mut words);
                VectorBuf::from_part(planned.with_words(&words))
            })
            .collect()
    }
}

fn set_positions(words: &mut [u64], positions: &[u16]) {
    for &low in positions {
        words[usize::from(low) / 64] |= 1 << (low % 64);
    }
}

/// A term of an intersection: the key-disjoint parts, ascending, whose union is its vector.
#[derive(Debug, Clone, Copy)]
pub struct Term<'t, 'a> {
    parts: &'t [VectorPart<'a>],
}

impl<'t, 'a> Term<'t, 'a> {
    /// Checks that the parts' key ranges ascend without overlapping.
    pub fn new(parts: &'t [VectorPart<'a>]) -> Result<Self, MalformedPart> {
        let mut last: Option<u16> = None;
        for part in parts {
            if let Some((first, end)) = part.key_range() {
                if last.is_some_and(|l| l >= first) {
                    return Err(MalformedPart(
                        "the parts of a term overlap or are out of key order".into(),
                    ));
                }
                last = Some(end);
            }
        }
        Ok(Term { parts })
    }

    /// The container with key `key`, if the term has one.
    pub fn container(&self, key: u16) -> Option<ContainerRef<'a>> {
        let i = self
            .parts
            .partition_point(|p| p.key_range().is_some_and(|(_, end)| end < key));
        self.parts.get(i)?.container(key)
    }

    fn container_count(&self) -> usize {
        self.parts.iter().map(|p| p.container_count()).sum()
    }

    fn containers(&self) -> impl Iterator<Item = (u16, ContainerRef<'a>)> + 't {
        self.parts.iter().flat_map(|p| p.containers())
    }
}

/// The plan of an intersection (AND) of terms.
#[derive(Debug, Clone)]
pub struct IntersectionPlan {
    parts: Vec<PlannedPart>,
}

impl IntersectionPlan {
    /// Plans the intersection of `terms`. An output container is dense where
    /// every term is dense (it may turn out all zero); sparse containers are
    /// computed now. No terms at all is the empty vector.
    pub fn new(terms: &[Term<'_, '_>]) -> IntersectionPlan {
        let mut splitter = PartSplitter::new();
        let Some(smallest) = terms.iter().min_by_key(|t| t.container_count()) else {
            return IntersectionPlan {
                parts: splitter.finish(),
            };
        };
        let mut values = Vec::new();
        for (key, _) in smallest.containers() {
            let Some(containers) = containers_at(terms, key) else {
                continue;
            };
            if containers
                .iter()
                .all(|c| matches!(c, ContainerRef::Dense(_)))
            {
                splitter.dense(key);
                continue;
            }
            values.clear();
            values.extend(sparse_intersection(&containers));
            if !values.is_empty() {
                splitter.sparse(key, &values);
            }
        }
        IntersectionPlan {
            parts: splitter.finish(),
        }
    }

    /// The output parts, key-disjoint and ascending.
    pub fn parts(&self) -> &[PlannedPart] {
        &self.parts
    }

    /// Writes the dense containers of output part `part` into `out` (exactly
    /// [`PlannedPart::dense_word_count`] words). `terms` must be the ones the
    /// plan was made from.
    ///
    /// # Panics
    ///
    /// If `out` has the wrong length.
    pub fn fill(&self, part: usize, terms: &[Term<'_, '_>], out: &mut [u64]) {
        let planned = &self.parts[part];
        assert_eq!(
            out.len(),
            planned.dense_word_count(),
            "output buffer has the wrong length"
        );
        for (slot, &key) in planned.dense_keys.iter().enumerate() {
            let target = &mut out[slot * CONTAINER_WORDS..(slot + 1) * CONTAINER_WORDS];
            target.fill(u64::MAX);
            for term in terms {
                if let Some(ContainerRef::Dense(words)) = term.container(key) {
                    kernels::and_into(target, &words[..]);
                }
            }
        }
    }

    /// Runs the whole fold into owned vectors, one per output part.
    pub fn run(&self, terms: &[Term<'_, '_>]) -> Vec<VectorBuf> {
        self.parts
            .iter()
            .enumerate()
            .map(|(i, planned)| {
                let mut words = vec![0u64; planned.dense_word_count()];
                self.fill(i, terms, &mut words);
                VectorBuf::from_part(planned.with_words(&words))
            })
            .collect()
    }
}

fn containers_at<'a>(terms: &[Term<'_, 'a>], key: u16) -> Option<Vec<ContainerRef<'a>>> {
    terms.iter().map(|t| t.container(key)).collect()
}

/// Positions set in every container, where at least one is sparse.
fn sparse_intersection<'a>(containers: &[ContainerRef<'a>]) -> impl Iterator<Item = u16> + 'a {
    let shortest = containers
        .iter()
        .filter_map(|c| match c {
            ContainerRef::Sparse(values) => Some(*values),
            ContainerRef::Dense(_) => None,
        })
        .min_by_key(|values| values.len())
        .unwrap_or(&[]);
    let others = containers.to_vec();
    shortest
        .iter()
        .copied()
        .filter(move |&low| others.iter().all(|c| c.contains(low)))
}

/// Number of bits in the intersection of `terms`, without building it.
pub fn intersection_count(terms: &[Term<'_, '_>]) -> u64 {
    let Some(smallest) = terms.iter().min_by_key(|t| t.container_count()) else {
        return 0;
    };
    let mut count = 0;
    for (key, _) in smallest.containers() {
        let Some(containers) = containers_at(terms, key) else {
            continue;
        };
        let dense: Vec<&[u64]> = containers
            .iter()
            .filter_map(|c| match c {
                ContainerRef::Dense(words) => Some(&words[..]),
                ContainerRef::Sparse(_) => None,
            })
            .collect();
        count += if dense.len() == containers.len() {
            kernels::and_count(&dense)
        } else {
            sparse_intersection(&containers).count() as u64
        };
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn bits_of(bufs: &[VectorBuf]) -> BTreeSet<u32> {
        bufs.iter()
            .flat_map(|b| b.as_part().bits().collect::<Vec<_>>())
            .collect()
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
