//! The expected answers, computed with plain `BTreeSet`s: the one oracle of
//! the process-level tests (`tests/`) and of bitfold-server's cluster tests
//! (which include this file by path), so both check against the same
//! reading of docs/protocol.md §2.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

/// The expected state of the index: vid → set bits.
#[derive(Debug, Default, Clone)]
pub struct Oracle {
    /// Every vector imported so far.
    pub vectors: BTreeMap<u64, BTreeSet<u32>>,
}

impl Oracle {
    /// Records an import of `bits` into `vid` (union, as the system does;
    /// importing no bits creates nothing).
    pub fn add<B: Borrow<u32>>(&mut self, vid: u64, bits: impl IntoIterator<Item = B>) {
        let bits: BTreeSet<u32> = bits.into_iter().map(|b| *b.borrow()).collect();
        if !bits.is_empty() {
            self.vectors.entry(vid).or_default().extend(bits);
        }
    }

    /// Records a clear of `bits` in `vid` (docs/protocol.md §8): the vector
    /// keeps existing, possibly empty; nothing happens if it does not
    /// exist. Returns whether it lost a bit.
    pub fn clear<B: Borrow<u32>>(&mut self, vid: u64, bits: impl IntoIterator<Item = B>) -> bool {
        let Some(held) = self.vectors.get_mut(&vid) else {
            return false;
        };
        let before = held.len();
        for bit in bits {
            held.remove(bit.borrow());
        }
        held.len() != before
    }

    /// Records a delete of every vector in `first..=last`; returns how many existed.
    pub fn delete(&mut self, first: u64, last: u64) -> usize {
        let gone: Vec<u64> = self.vectors.range(first..=last).map(|(&v, _)| v).collect();
        for vid in &gone {
            self.vectors.remove(vid);
        }
        gone.len()
    }

    /// The answer to `R:` with the given inclusive terms.
    pub fn range(&self, terms: &[(u64, u64)]) -> BTreeSet<u32> {
        let mut result: Option<BTreeSet<u32>> = None;
        for &(first, last) in terms {
            let union: BTreeSet<u32> = self
                .vectors
                .range(first..=last)
                .flat_map(|(_, bits)| bits.iter().copied())
                .collect();
            result = Some(match result {
                None => union,
                Some(acc) => acc.intersection(&union).copied().collect(),
            });
        }
        result.unwrap_or_default()
    }
}
