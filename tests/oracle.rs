//! The expected answers, computed with plain `BTreeSet`s: the one oracle of
//! the process-level tests (`tests/`) and of bitfold-rpc's cluster tests
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
