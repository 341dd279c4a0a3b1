//! Vectors as roaring containers whose dense form is 64-bit words.
//!
//! A vector is a set of bit positions `0 <= b < 2^32`. Bit `b` lives in the
//! container with key `b >> 16`, at position `b & 0xffff`. A container is
//! either *dense*, 1024 little-endian `u64` words (bit `p` is bit `p % 64` of
//! word `p / 64`, exactly the dense form of the contract cut into 8 KiB
//! pieces), or *sparse*, the ascending `u16` positions of a roaring array
//! container.
//!
//! Why containers and not one flat word vector: bit positions reach 2^32, so a
//! flat vector can be 512 MiB however few bits it holds; containers make empty
//! regions free and sparse regions cheap, while dense regions stay plain words
//! that the kernels stream. Why a sparse container turns dense at
//! [`SPARSE_MAX`] bits rather than roaring's 4096: ORing a dense container is
//! one pass over 8 KiB, while scattering array values costs a dependent
//! read-modify-write each, so past a few hundred values the words are faster
//! to fold (measured in `benches/`, see `benches/README.md`).
//!
//! [`VectorPart`] is the borrowed view every kernel works on: its slices come
//! straight from a store's mmap or from a Cap'n Proto message, with no copy.
//! [`VectorBuf`] is the owned form.

use std::fmt;

/// Bit positions per container: a container holds the bits whose high 16 bits equal its key.
pub const CONTAINER_BITS: usize = 1 << 16;

/// 64-bit words in a dense container (8 KiB).
pub const CONTAINER_WORDS: usize = CONTAINER_BITS / 64;

/// The most bits a builder keeps in a sparse container; a fuller one is made dense.
///
/// A union scatters each sparse value with a read-modify-write but streams a
/// dense container in one pass, so sparse inputs stop paying after a few
/// hundred bits per container; where exactly depends on whether the dense
/// ones come from L3 or from DRAM (benches/README.md, "Engine constants").
/// 256 sits between the two, and keeps a sparse container at most 512 bytes,
/// 1/16 of a dense one, on disk and on the wire.
pub const SPARSE_MAX: usize = 256;

/// The most dense containers one part may hold on the wire, so that its words
/// (256 MiB) fit comfortably in one Cap'n Proto `Data` (at most 2^29 - 1 bytes).
pub const PART_MAX_DENSE: usize = 32768;

/// The words of one dense container.
pub type DenseContainer = [u64; CONTAINER_WORDS];

/// The key of the container holding bit `bit`.
pub fn key_of(bit: u32) -> u16 {
    (bit >> 16) as u16
}

/// The first bit position of the container with key `key`.
pub fn first_bit_of(key: u16) -> u32 {
    u32::from(key) << 16
}

/// One container of a vector, borrowed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ContainerRef<'a> {
    /// 1024 words; any content, including all zero.
    Dense(&'a DenseContainer),
    /// Strictly ascending positions, at least one.
    Sparse(&'a [u16]),
}

impl<'a> ContainerRef<'a> {
    /// Number of bits set in the container.
    pub fn cardinality(&self) -> u32 {
        match self {
            ContainerRef::Dense(words) => crate::kernels::popcount(&words[..]) as u32,
            ContainerRef::Sparse(values) => values.len() as u32,
        }
    }

    /// Whether position `low` (the low 16 bits of a bit position) is set.
    pub fn contains(&self, low: u16) -> bool {
        match self {
            ContainerRef::Dense(words) => words[usize::from(low) / 64] >> (low % 64) & 1 == 1,
            ContainerRef::Sparse(values) => values.binary_search(&low).is_ok(),
        }
    }

    /// The set positions of the container, ascending.
    pub fn positions(self) -> impl Iterator<Item = u16> + 'a {
        let (sparse, dense) = match self {
            ContainerRef::Sparse(values) => (values, None),
            ContainerRef::Dense(words) => (&[][..], Some(words)),
        };
        let dense_bits = dense.into_iter().flat_map(|words| {
            words
                .iter()
                .enumerate()
                .flat_map(|(w, &word)| SetBits(word).map(move |b| (w * 64) as u16 + b as u16))
        });
        sparse.iter().copied().chain(dense_bits)
    }
}

impl fmt::Debug for ContainerRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerRef::Dense(_) => write!(f, "Dense({} bits)", self.cardinality()),
            ContainerRef::Sparse(values) => write!(f, "Sparse({values:?})"),
        }
    }
}

/// Why a set of slices is not a valid [`VectorPart`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed vector part: {0}")]
pub struct MalformedPart(pub String);

fn malformed(what: impl Into<String>) -> MalformedPart {
    MalformedPart(what.into())
}

/// A borrowed vector, or a piece of one: its dense and sparse containers.
///
/// Invariants (checked by [`VectorPart::new`]): keys ascend strictly within
/// each list and no key is both dense and sparse; `dense_words` holds
/// [`CONTAINER_WORDS`] words per dense key; `sparse_ends` holds one end offset
/// per sparse key into `sparse_values`, ascending, the last equal to its
/// length; each sparse container is non-empty and strictly ascending.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct VectorPart<'a> {
    dense_keys: &'a [u16],
    dense_words: &'a [u64],
    sparse_keys: &'a [u16],
    sparse_ends: &'a [u32],
    sparse_values: &'a [u16],
}

impl<'a> VectorPart<'a> {
    /// The part with no containers.
    pub const EMPTY: VectorPart<'static> = VectorPart {
        dense_keys: &[],
        dense_words: &[],
        sparse_keys: &[],
        sparse_ends: &[],
        sparse_values: &[],
    };

    /// Checks the invariants and builds the view; the slices are not copied.
    pub fn new(
        dense_keys: &'a [u16],
        dense_words: &'a [u64],
        sparse_keys: &'a [u16],
        sparse_ends: &'a [u32],
        sparse_values: &'a [u16],
    ) -> Result<Self, MalformedPart> {
        if !strictly_ascending(dense_keys) {
            return Err(malformed("dense keys are not strictly ascending"));
        }
        if dense_words.len() != dense_keys.len() * CONTAINER_WORDS {
            return Err(malformed(format!(
                "{} dense keys need {} words, found {}",
                dense_keys.len(),
                dense_keys.len() * CONTAINER_WORDS,
                dense_words.len()
            )));
        }
        if !strictly_ascending(sparse_keys) {
            return Err(malformed("sparse keys are not strictly ascending"));
        }
        if sparse_ends.len() != sparse_keys.len() {
            return Err(malformed(format!(
                "{} sparse keys but {} end offsets",
                sparse_keys.len(),
                sparse_ends.len()
            )));
        }
        if sparse_ends.last().map_or(0, |&end| end as usize) != sparse_values.len() {
            return Err(malformed(
                "the last sparse end offset is not the number of values",
            ));
        }
        let mut start = 0usize;
        for &end in sparse_ends {
            let end = end as usize;
            if end <= start {
                return Err(malformed(
                    "a sparse container is empty or its end offset goes back",
                ));
            }
            if !strictly_ascending(&sparse_values[start..end]) {
                return Err(malformed("sparse positions are not strictly ascending"));
            }
            start = end;
        }
        if sorted_lists_intersect(dense_keys, sparse_keys) {
            return Err(malformed("a key is both dense and sparse"));
        }
        Ok(VectorPart {
            dense_keys,
            dense_words,
            sparse_keys,
            sparse_ends,
            sparse_values,
        })
    }

    /// Builds the view from slices the caller has already checked (a store
    /// file verified when it was opened, a buffer this crate built).
    pub(crate) fn from_verified(
        dense_keys: &'a [u16],
        dense_words: &'a [u64],
        sparse_keys: &'a [u16],
        sparse_ends: &'a [u32],
        sparse_values: &'a [u16],
    ) -> Self {
        debug_assert!(
            VectorPart::new(
                dense_keys,
                dense_words,
                sparse_keys,
                sparse_ends,
                sparse_values
            )
            .is_ok()
        );
        VectorPart {
            dense_keys,
            dense_words,
            sparse_keys,
            sparse_ends,
            sparse_values,
        }
    }

    /// Ascending keys of the dense containers.
    pub fn dense_keys(&self) -> &'a [u16] {
        self.dense_keys
    }

    /// The words of every dense container, 1024 per key, in key order.
    pub fn dense_words(&self) -> &'a [u64] {
        self.dense_words
    }

    /// Ascending keys of the sparse containers.
    pub fn sparse_keys(&self) -> &'a [u16] {
        self.sparse_keys
    }

    /// End offset of each sparse container in [`VectorPart::sparse_values`].
    pub fn sparse_ends(&self) -> &'a [u32] {
        self.sparse_ends
    }

    /// The positions of every sparse container, in key order.
    pub fn sparse_values(&self) -> &'a [u16] {
        self.sparse_values
    }

    /// Where the `i`-th sparse container's positions start in
    /// [`VectorPart::sparse_values`]; `i` = the number of sparse containers
    /// gives the end of the last one.
    pub fn sparse_start(&self, i: usize) -> usize {
        match i.checked_sub(1) {
            None => 0,
            Some(before) => self.sparse_ends[before] as usize,
        }
    }

    /// The positions of the `i`-th sparse container (in key order).
    pub fn sparse_container(&self, i: usize) -> &'a [u16] {
        &self.sparse_values[self.sparse_start(i)..self.sparse_start(i + 1)]
    }

    /// Number of containers, dense and sparse.
    pub fn container_count(&self) -> usize {
        self.dense_keys.len() + self.sparse_keys.len()
    }

    /// The dense containers with their keys, ascending.
    pub fn dense_containers(
        &self,
    ) -> impl ExactSizeIterator<Item = (u16, &'a DenseContainer)> + 'a {
        let words = self.dense_words;
        self.dense_keys
            .iter()
            .enumerate()
            .map(move |(i, &key)| (key, dense_at(words, i)))
    }

    /// The sparse containers with their keys, ascending.
    pub fn sparse_containers(&self) -> impl ExactSizeIterator<Item = (u16, &'a [u16])> + 'a {
        let part = *self;
        self.sparse_keys
            .iter()
            .enumerate()
            .map(move |(i, &key)| (key, part.sparse_container(i)))
    }

    /// Every container with its key, ascending by key.
    pub fn containers(&self) -> Containers<'a> {
        Containers {
            part: *self,
            dense: 0,
            sparse: 0,
        }
    }

    /// The container with key `key`, if the part has one.
    pub fn container(&self, key: u16) -> Option<ContainerRef<'a>> {
        if let Ok(i) = self.dense_keys.binary_search(&key) {
            return Some(ContainerRef::Dense(dense_at(self.dense_words, i)));
        }
        let i = self.sparse_keys.binary_search(&key).ok()?;
        Some(ContainerRef::Sparse(self.sparse_container(i)))
    }

    /// Whether bit `bit` is set.
    pub fn contains(&self, bit: u32) -> bool {
        self.container(key_of(bit))
            .is_some_and(|c| c.contains(bit as u16))
    }

    /// Number of bits set.
    pub fn cardinality(&self) -> u64 {
        crate::kernels::popcount(self.dense_words) + self.sparse_values.len() as u64
    }

    /// Bytes of its slices (words, keys, ends and values): what reading it
    /// touches, and what it takes in a segment file before alignment.
    pub fn byte_len(&self) -> u64 {
        (size_of_val(self.dense_words)
            + size_of_val(self.dense_keys)
            + size_of_val(self.sparse_keys)
            + size_of_val(self.sparse_ends)
            + size_of_val(self.sparse_values)) as u64
    }

    /// Whether no bit is set (a part may hold all-zero dense containers).
    pub fn is_empty(&self) -> bool {
        self.sparse_values.is_empty() && self.dense_words.iter().all(|&w| w == 0)
    }

    /// The smallest and largest container key, or `None` for a part with no containers.
    pub fn key_range(&self) -> Option<(u16, u16)> {
        let first = match (self.dense_keys.first(), self.sparse_keys.first()) {
            (Some(&d), Some(&s)) => d.min(s),
            (Some(&k), None) | (None, Some(&k)) => k,
            (None, None) => return None,
        };
        let last = match (self.dense_keys.last(), self.sparse_keys.last()) {
            (Some(&d), Some(&s)) => d.max(s),
            (Some(&k), None) | (None, Some(&k)) => k,
            (None, None) => unreachable!("a part with a first key has a last key"),
        };
        Some((first, last))
    }

    /// The set bits, ascending.
    pub fn bits(&self) -> impl Iterator<Item = u32> + use<'a> {
        self.containers().flat_map(|(key, container)| {
            let base = first_bit_of(key);
            container.positions().map(move |low| base | u32::from(low))
        })
    }
}

impl fmt::Debug for VectorPart<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.containers()).finish()
    }
}

fn dense_at(words: &[u64], index: usize) -> &DenseContainer {
    let start = index * CONTAINER_WORDS;
    words[start..start + CONTAINER_WORDS]
        .try_into()
        .expect("a dense container is exactly CONTAINER_WORDS words")
}

fn strictly_ascending<T: Ord>(values: &[T]) -> bool {
    values.windows(2).all(|w| w[0] < w[1])
}

fn sorted_lists_intersect(a: &[u16], b: &[u16]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

/// The positions of the set bits of one word, ascending.
struct SetBits(u64);

impl Iterator for SetBits {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let bit = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(bit)
    }
}

/// Iterator over the containers of a part in ascending key order.
#[derive(Clone)]
pub struct Containers<'a> {
    part: VectorPart<'a>,
    dense: usize,
    sparse: usize,
}

impl<'a> Iterator for Containers<'a> {
    type Item = (u16, ContainerRef<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let dense_key = self.part.dense_keys.get(self.dense).copied();
        let sparse_key = self.part.sparse_keys.get(self.sparse).copied();
        let take_dense = match (dense_key, sparse_key) {
            (None, None) => return None,
            (Some(d), Some(s)) => d < s,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if take_dense {
            let i = self.dense;
            self.dense += 1;
            Some((
                self.part.dense_keys[i],
                ContainerRef::Dense(dense_at(self.part.dense_words, i)),
            ))
        } else {
            let i = self.sparse;
            self.sparse += 1;
            Some((
                self.part.sparse_keys[i],
                ContainerRef::Sparse(self.part.sparse_container(i)),
            ))
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.part.container_count() - self.dense - self.sparse;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Containers<'_> {}

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
        let mut words = [0u64; CONTAINER_WORDS];
        for &low in values {
            words[usize::from(low) / 64] |= 1 << (low % 64);
        }
        self.dense_keys.push(key);
        self.dense_words.extend_from_slice(&words);
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
        let positions: Vec<u16> = ContainerRef::Dense(words).positions().collect();
        self.push_sparse(key, &positions)
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
    use std::collections::BTreeSet;

    #[test]
    fn bits_round_trip_through_both_representations() {
        let mut bits: Vec<u32> = (0..600).map(|i| i * 3).collect(); // dense container 0
        bits.extend([70_000, 70_001, u32::MAX - 1, u32::MAX]); // sparse containers
        let buf = VectorBuf::from_sorted_bits(&bits);
        let part = buf.as_part();
        assert_eq!(part.dense_keys(), &[0]);
        assert_eq!(part.sparse_keys(), &[1, u16::MAX]);
        assert_eq!(part.bits().collect::<Vec<_>>(), bits);
        assert_eq!(part.cardinality(), bits.len() as u64);
        assert!(part.contains(u32::MAX) && part.contains(0) && !part.contains(1));
        assert_eq!(part.key_range(), Some((0, u16::MAX)));
    }

    #[test]
    fn from_bits_sorts_and_dedups() {
        let buf = VectorBuf::from_bits(vec![5, 1, 5, 1 << 20, 0]);
        assert_eq!(
            buf.as_part().bits().collect::<Vec<_>>(),
            vec![0, 1, 5, 1 << 20]
        );
    }

    #[test]
    fn new_rejects_broken_invariants() {
        let words = vec![0u64; CONTAINER_WORDS];
        assert!(VectorPart::new(&[2, 1], &[], &[], &[], &[]).is_err());
        assert!(VectorPart::new(&[1], &words[..10], &[], &[], &[]).is_err());
        assert!(VectorPart::new(&[1], &words, &[1], &[1], &[3]).is_err());
        assert!(VectorPart::new(&[], &[], &[1], &[2], &[3, 3]).is_err());
        assert!(VectorPart::new(&[], &[], &[1, 2], &[1, 1], &[3]).is_err());
        assert!(VectorPart::new(&[], &[], &[1], &[2], &[3]).is_err());
        assert!(VectorPart::new(&[1], &words, &[2], &[2], &[3, 4]).is_ok());
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
}
