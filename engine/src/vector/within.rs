//! A part narrowed to the containers whose keys lie in a range: one column
//! piece of a vector, as the master cuts a write into pieces.
//!
//! The dense words, dense keys, sparse keys and sparse positions are
//! borrowed from the part; only the end offsets of the sparse containers are
//! rebased when the range starts past the first of them (a few per piece:
//! four bytes per sparse container), so narrowing costs four binary searches.

use std::borrow::Cow;
use std::ops::RangeInclusive;

use super::{CONTAINER_WORDS, VectorPart};

/// The containers of a part with keys in a range ([`VectorPart::within`]);
/// [`Within::part`] reads it as a part.
#[derive(Debug, Clone)]
pub struct Within<'a> {
    dense_keys: &'a [u16],
    dense_words: &'a [u64],
    sparse_keys: &'a [u16],
    sparse_ends: Cow<'a, [u32]>,
    sparse_values: &'a [u16],
}

impl<'a> VectorPart<'a> {
    /// The containers of this part whose keys lie in `keys`.
    pub fn within(&self, keys: RangeInclusive<u16>) -> Within<'a> {
        let (first, last) = (*keys.start(), *keys.end());
        let span = |list: &[u16]| {
            list.partition_point(|&k| k < first)..list.partition_point(|&k| k <= last)
        };
        let dense = span(self.dense_keys);
        let sparse = span(self.sparse_keys);
        let (from, to) = (
            self.sparse_start(sparse.start),
            self.sparse_start(sparse.end),
        );
        let ends = &self.sparse_ends[sparse.clone()];
        let sparse_ends = if from == 0 {
            Cow::Borrowed(ends)
        } else {
            Cow::Owned(ends.iter().map(|&end| end - from as u32).collect())
        };
        Within {
            dense_keys: &self.dense_keys[dense.clone()],
            dense_words: &self.dense_words
                [dense.start * CONTAINER_WORDS..dense.end * CONTAINER_WORDS],
            sparse_keys: &self.sparse_keys[sparse],
            sparse_ends,
            sparse_values: &self.sparse_values[from..to],
        }
    }
}

impl Within<'_> {
    /// The narrowed containers, as a part.
    pub fn part(&self) -> VectorPart<'_> {
        VectorPart::from_verified(
            self.dense_keys,
            self.dense_words,
            self.sparse_keys,
            &self.sparse_ends,
            self.sparse_values,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ContainerRef, VectorBuf, key_of};
    use super::VectorPart;
    use proptest::prelude::*;

    /// Up to eight containers of keys 0 to 15, each sparse or dense.
    fn any_vector() -> impl Strategy<Value = VectorBuf> {
        let container = (
            proptest::collection::btree_set(any::<u16>(), 1..40),
            any::<bool>(),
        );
        proptest::collection::btree_map(0u16..16, container, 0..8).prop_map(|containers| {
            let mut buf = VectorBuf::new();
            for (key, (positions, dense)) in containers {
                let positions: Vec<u16> = positions.into_iter().collect();
                if dense {
                    let mut words = [0u64; super::CONTAINER_WORDS];
                    for &p in &positions {
                        words[usize::from(p / 64)] |= 1 << (p % 64);
                    }
                    buf.push_dense(key, &words).unwrap();
                } else {
                    buf.push_sparse(key, &positions).unwrap();
                }
            }
            buf
        })
    }

    proptest! {
        #[test]
        fn a_part_within_keys_holds_exactly_their_bits_in_their_forms(
            buf in any_vector(),
            first in 0u16..17,
            len in 0u16..17,
        ) {
            let part = buf.as_part();
            let whole = part.within(0..=u16::MAX);
            prop_assert_eq!(whole.part(), part);
            let last = first + len;
            let within = part.within(first..=last);
            let narrowed = within.part();
            let expected: Vec<u32> = part
                .bits()
                .filter(|&b| (first..=last).contains(&key_of(b)))
                .collect();
            prop_assert_eq!(narrowed.bits().collect::<Vec<_>>(), expected);
            // The same checks a part from a message passes.
            prop_assert!(VectorPart::new(
                narrowed.dense_keys(),
                narrowed.dense_words(),
                narrowed.sparse_keys(),
                narrowed.sparse_ends(),
                narrowed.sparse_values(),
            )
            .is_ok());
            for (key, container) in narrowed.containers() {
                let kept = matches!(container, ContainerRef::Dense(_));
                prop_assert_eq!(kept, part.dense_keys().contains(&key));
            }
        }
    }
}
