//! The owned vector, [`VectorBuf`], built container by container, and why
//! a container can be refused ([`PushError`]).

use std::fmt;

use super::{
    CONTAINER_WORDS, ContainerRef, DenseContainer, SPARSE_MAX, VectorPart, key_of,
    strictly_ascending,
};

/// Why a container could not be appended to a [`VectorBuf`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// Containers must be pushed in strictly ascending key order.
    #[error("container key {key} does not come after key {last}")]
    KeyOrder {
        /// The key pushed.
        key: u16,
        /// The last key already in the buffer.
        last: u16,
    },
    /// A sparse container must be non-empty and strictly ascending.
    #[error("sparse container {key} is empty or not strictly ascending")]
    BadSparse {
        /// The key pushed.
        key: u16,
    },
}

/// An owned vector: the same layout as [`VectorPart`], in `Vec`s.
///
/// Built container by container in ascending key order, from bits, or by
/// copying a part.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct VectorBuf {
    dense_keys: Vec<u16>,
    dense_words: Vec<u64>,
    sparse_keys: Vec<u16>,
    sparse_ends: Vec<u32>,
    sparse_values: Vec<u16>,
}

impl VectorBuf {
    /// The empty vector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a vector from bit positions in any order, with repeats.
    pub fn from_bits(mut bits: Vec<u32>) -> Self {
        bits.sort_unstable();
        bits.dedup();
        Self::from_sorted_bits(&bits)
    }

    /// Builds a vector from strictly ascending bit positions; containers get
    /// the representation their cardinality calls for ([`SPARSE_MAX`]).
    ///
    /// # Panics
    ///
    /// If `bits` is not strictly ascending.
    pub fn from_sorted_bits(bits: &[u32]) -> Self {
        assert!(strictly_ascending(bits), "bits must be strictly ascending");
        let mut buf = VectorBuf::new();
        let mut rest = bits;
        let mut lows = Vec::new();
        while let Some(&first) = rest.first() {
            let key = key_of(first);
            let len = rest.partition_point(|&b| key_of(b) == key);
            lows.clear();
            lows.extend(rest[..len].iter().map(|&b| b as u16));
            buf.push_positions(key, &lows)
                .expect("keys ascend and positions are sorted");
            rest = &rest[len..];
        }
        buf
    }

    /// Copies a part.
    pub fn from_part(part: VectorPart<'_>) -> Self {
        VectorBuf {
            dense_keys: part.dense_keys.to_vec(),
            dense_words: part.dense_words.to_vec(),
            sparse_keys: part.sparse_keys.to_vec(),
            sparse_ends: part.sparse_ends.to_vec(),
            sparse_values: part.sparse_values.to_vec(),
        }
    }

    /// Copies `part` with each container sparse if it holds at most
    /// `sparse_max` bits, dense if it holds more, and left out if empty.
    /// [`SPARSE_MAX`] gives the form the kernels fold fastest; roaring's
    /// 4096 ([`crate::portable::ARRAY_MAX`]) the smallest.
    pub fn reshaped(part: VectorPart<'_>, sparse_max: usize) -> Self {
        let mut buf = VectorBuf::new();
        let mut positions = Vec::new();
        for (key, container) in part.containers() {
            let count = container.cardinality() as usize;
            let pushed = match container {
                _ if count == 0 => Ok(()),
                ContainerRef::Sparse(values) if count <= sparse_max => buf.push_sparse(key, values),
                ContainerRef::Dense(words) if count > sparse_max => buf.push_dense(key, words),
                ContainerRef::Dense(words) => {
                    dense_positions(words, count, &mut positions);
                    buf.push_sparse(key, &positions)
                }
                ContainerRef::Sparse(values) => buf.push_dense(key, &dense_words(values)),
            };
            pushed.expect("a part's containers ascend and are valid");
        }
        buf
    }

    /// The borrowed view of this vector.
    pub fn as_part(&self) -> VectorPart<'_> {
        VectorPart::from_verified(
            &self.dense_keys,
            &self.dense_words,
            &self.sparse_keys,
            &self.sparse_ends,
            &self.sparse_values,
        )
    }

    /// The key of the last container pushed.
    pub fn last_key(&self) -> Option<u16> {
        match (self.dense_keys.last(), self.sparse_keys.last()) {
            (Some(&d), Some(&s)) => Some(d.max(s)),
            (Some(&k), None) | (None, Some(&k)) => Some(k),
            (None, None) => None,
        }
    }

    fn check_order(&self, key: u16) -> Result<(), PushError> {
        match self.last_key() {
            Some(last) if last >= key => Err(PushError::KeyOrder { key, last }),
            _ => Ok(()),
        }
    }

    /// Appends a dense container as it is (even if sparse or all zero).
    pub fn push_dense(&mut self, key: u16, words: &DenseContainer) -> Result<(), PushError> {
        self.check_order(key)?;
        self.dense_keys.push(key);
        self.dense_words.extend_from_slice(words);
        Ok(())
    }

    /// Appends a sparse container as it is (even if larger than [`SPARSE_MAX`]).
    pub fn push_sparse(&mut self, key: u16, values: &[u16]) -> Result<(), PushError> {
        self.check_order(key)?;
        if values.is_empty() || !strictly_ascending(values) {
            return Err(PushError::BadSparse { key });
        }
        self.sparse_keys.push(key);
        self.sparse_values.extend_from_slice(values);
        self.sparse_ends.push(self.sparse_values.len() as u32);
        Ok(())
    }

    /// Appends the container holding the strictly ascending positions
    /// `values`, sparse or dense as [`SPARSE_MAX`] says; nothing if empty.
    pub fn push_positions(&mut self, key: u16, values: &[u16]) -> Result<(), PushError> {
        if values.is_empty() {
            return Ok(());
        }
        if values.len() <= SPARSE_MAX {
            return self.push_sparse(key, values);
        }
        if !strictly_ascending(values) {
            return Err(PushError::BadSparse { key });
        }
        self.check_order(key)?;
        self.dense_keys.push(key);
        self.dense_words.extend_from_slice(&dense_words(values));
        Ok(())
    }

    /// Appends the container with words `words`, sparse or dense as
    /// [`SPARSE_MAX`] says; nothing if all zero.
    pub fn push_words(&mut self, key: u16, words: &DenseContainer) -> Result<(), PushError> {
        let count = crate::kernels::popcount(words) as usize;
        if count == 0 {
            return Ok(());
        }
        if count > SPARSE_MAX {
            return self.push_dense(key, words);
        }
        let mut positions = Vec::new();
        dense_positions(words, count, &mut positions);
        self.push_sparse(key, &positions)
    }
}

/// The words of the container whose set positions are `values`.
fn dense_words(values: &[u16]) -> DenseContainer {
    let mut words = [0u64; CONTAINER_WORDS];
    for &low in values {
        words[usize::from(low) / 64] |= 1 << (low % 64);
    }
    words
}

/// Sets `out` to the positions of the bits set in `words`, ascending;
/// `count` is how many are.
fn dense_positions(words: &DenseContainer, count: usize, out: &mut Vec<u16>) {
    out.clear();
    out.reserve(count);
    for (w, &word) in words.iter().enumerate() {
        let mut rest = word;
        while rest != 0 {
            out.push((w * 64) as u16 + rest.trailing_zeros() as u16);
            rest &= rest - 1;
        }
    }
}

impl fmt::Debug for VectorBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_part().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn from_bits_sorts_and_dedups() {
        let buf = VectorBuf::from_bits(vec![5, 1, 5, 1 << 20, 0]);
        assert_eq!(
            buf.as_part().bits().collect::<Vec<_>>(),
            vec![0, 1, 5, 1 << 20]
        );
    }

    #[test]
    fn push_rejects_keys_out_of_order() {
        let mut buf = VectorBuf::new();
        buf.push_sparse(3, &[1]).unwrap();
        assert_eq!(
            buf.push_sparse(3, &[2]),
            Err(PushError::KeyOrder { key: 3, last: 3 })
        );
        assert_eq!(
            buf.push_sparse(4, &[]),
            Err(PushError::BadSparse { key: 4 })
        );
    }

    #[test]
    fn push_words_picks_the_representation() {
        let mut words = [0u64; CONTAINER_WORDS];
        words[0] = 0b1011;
        let mut buf = VectorBuf::new();
        buf.push_words(7, &words).unwrap();
        buf.push_words(8, &[0; CONTAINER_WORDS]).unwrap();
        buf.push_words(9, &[u64::MAX; CONTAINER_WORDS]).unwrap();
        let part = buf.as_part();
        assert_eq!(part.sparse_keys(), &[7]);
        assert_eq!(part.sparse_values(), &[0, 1, 3]);
        assert_eq!(part.dense_keys(), &[9]);
        let expected: BTreeSet<u32> = [7 << 16, (7 << 16) + 1, (7 << 16) + 3]
            .into_iter()
            .chain((9u32 << 16)..(10u32 << 16))
            .collect();
        assert_eq!(part.bits().collect::<BTreeSet<_>>(), expected);
    }

    /// Containers of 0 to 5,000 bits, each stored sparse or dense at random.
    fn any_form() -> impl Strategy<Value = VectorBuf> {
        let container = (0u16..8, 0usize..5_000, any::<bool>(), any::<u64>());
        proptest::collection::btree_map(0u16..8, container, 0..6).prop_map(|containers| {
            let mut buf = VectorBuf::new();
            for (key, (_, count, dense, seed)) in containers {
                let mut words = [0u64; CONTAINER_WORDS];
                let mut x = seed | 1;
                for _ in 0..count {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    words[(x % 1024) as usize] |= 1 << (x >> 58);
                }
                let positions: Vec<u16> = ContainerRef::Dense(&words).positions().collect();
                if dense {
                    buf.push_dense(key, &words).unwrap();
                } else if !positions.is_empty() {
                    buf.push_sparse(key, &positions).unwrap();
                }
            }
            buf
        })
    }

    proptest! {
        #[test]
        fn reshaping_keeps_the_bits_and_picks_forms_by_count(
            buf in any_form(),
            sparse_max in prop_oneof![Just(SPARSE_MAX), Just(crate::portable::ARRAY_MAX), 0usize..300],
        ) {
            let reshaped = VectorBuf::reshaped(buf.as_part(), sparse_max);
            let part = reshaped.as_part();
            prop_assert!(part.bits().eq(buf.as_part().bits()));
            for (_, container) in part.containers() {
                let count = container.cardinality() as usize;
                prop_assert!(count > 0);
                prop_assert_eq!(matches!(container, ContainerRef::Sparse(_)), count <= sparse_max);
            }
            let twice = VectorBuf::reshaped(
                VectorBuf::reshaped(buf.as_part(), crate::portable::ARRAY_MAX).as_part(),
                SPARSE_MAX,
            );
            prop_assert_eq!(twice, VectorBuf::reshaped(buf.as_part(), SPARSE_MAX));
        }
    }
}
