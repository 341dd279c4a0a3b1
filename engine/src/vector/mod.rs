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
//!
//! This file holds the constants and [`VectorPart`]; `container.rs` holds
//! [`ContainerRef`], one container, `buf.rs` holds [`VectorBuf`], and
//! `within.rs` narrows a part to a range of keys ([`Within`]).

mod buf;
mod container;
mod within;

use std::fmt;

pub use buf::{PushError, VectorBuf};
pub use container::ContainerRef;
pub use within::Within;

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
            if end > sparse_values.len() {
                return Err(malformed(format!(
                    "a sparse end offset ({end}) is past the {} values",
                    sparse_values.len()
                )));
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn new_rejects_broken_invariants() {
        let words = vec![0u64; CONTAINER_WORDS];
        assert!(VectorPart::new(&[2, 1], &[], &[], &[], &[]).is_err());
        assert!(VectorPart::new(&[1], &words[..10], &[], &[], &[]).is_err());
        assert!(VectorPart::new(&[1], &words, &[1], &[1], &[3]).is_err());
        assert!(VectorPart::new(&[], &[], &[1], &[2], &[3, 3]).is_err());
        assert!(VectorPart::new(&[], &[], &[1, 2], &[1, 1], &[3]).is_err());
        assert!(VectorPart::new(&[], &[], &[1], &[2], &[3]).is_err());
        // An earlier end past the values, the last one right (found by fuzzing).
        let past = VectorPart::new(&[], &[], &[1, 2], &[9, 2], &[3, 4]).unwrap_err();
        assert!(past.to_string().contains("past the 2 values"), "{past}");
        assert!(VectorPart::new(&[1], &words, &[2], &[2], &[3, 4]).is_ok());
    }
}
