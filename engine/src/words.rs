//! The dense `words` form of a vector (docs/protocol.md §3): little-endian `u64` words,
//! bit `b` in bit `b % 64` of word `b / 64`, trailing zero words trimmed, so
//! the empty vector is zero words.
//!
//! ```
//! use bitfold_engine::{words, VectorBuf};
//!
//! let v = VectorBuf::from_bits(vec![0, 65, 200]);
//! let parts = [v.as_part()];
//! let mut out = vec![0; words::word_len(&parts)];
//! words::write_words(&parts, &mut out);
//! assert_eq!(out, [1, 2, 0, 1 << 8]);
//! ```

use crate::vector::{CONTAINER_WORDS, ContainerRef, VectorPart};

/// Number of words in the dense form of the union of `parts`: one past the
/// word holding the highest set bit, 0 if no bit is set.
///
/// The parts may come in any order and overlap.
pub fn word_len(parts: &[VectorPart<'_>]) -> usize {
    parts.iter().map(part_word_len).max().unwrap_or(0)
}

fn part_word_len(part: &VectorPart<'_>) -> usize {
    let dense = part
        .dense_keys()
        .iter()
        .zip(part.dense_words().chunks_exact(CONTAINER_WORDS))
        .rev()
        .find_map(|(&key, words)| {
            let last = words.iter().rposition(|&w| w != 0)?;
            Some(usize::from(key) * CONTAINER_WORDS + last + 1)
        })
        .unwrap_or(0);
    // Sparse values are in key order: the last one is the highest sparse bit.
    let sparse = match (part.sparse_keys().last(), part.sparse_values().last()) {
        (Some(&key), Some(&high)) => {
            usize::from(key) * CONTAINER_WORDS + usize::from(high) / 64 + 1
        }
        _ => 0,
    };
    dense.max(sparse)
}

/// Writes the dense form of the union of `parts` into `out`, overwriting it.
///
/// Each word is written once where no two parts share a container (a union
/// reply's parts): a dense container is copied and the gaps between
/// containers zeroed, rather than zeroing everything and ORing on top.
/// Where parts overlap, later containers are ORed in.
///
/// # Panics
///
/// If `out.len()` is not [`word_len`]`(parts)`.
pub fn write_words(parts: &[VectorPart<'_>], out: &mut [u64]) {
    assert_eq!(
        out.len(),
        word_len(parts),
        "write_words: the output must be exactly word_len words"
    );
    // `out[..filled]` holds the union of the containers seen so far.
    let mut filled = 0;
    for part in parts {
        for (key, container) in part.containers() {
            let start = usize::from(key) * CONTAINER_WORDS;
            if start >= out.len() {
                // Only all-zero dense containers lie past the highest set bit.
                break;
            }
            let end = (start + CONTAINER_WORDS).min(out.len());
            // Containers are aligned and `filled` ends one (or `out`): a
            // container that starts before it lies wholly inside it.
            let fresh = start >= filled;
            if fresh {
                out[filled..start].fill(0);
                filled = end;
            }
            let target = &mut out[start..end];
            match container {
                ContainerRef::Dense(words) if fresh => {
                    target.copy_from_slice(&words[..target.len()]);
                }
                ContainerRef::Dense(words) => {
                    crate::kernels::or_into(target, &words[..target.len()]);
                }
                ContainerRef::Sparse(values) => {
                    if fresh {
                        target.fill(0);
                    }
                    for &low in values {
                        target[usize::from(low) / 64] |= 1 << (low % 64);
                    }
                }
            }
        }
    }
    out[filled..].fill(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VectorBuf;
    use proptest::prelude::*;

    fn bits_of_words(words: &[u64]) -> Vec<u32> {
        let mut bits = Vec::new();
        for (i, &w) in words.iter().enumerate() {
            for b in 0..64 {
                if w >> b & 1 == 1 {
                    bits.push((i * 64 + b) as u32);
                }
            }
        }
        bits
    }

    #[test]
    fn empty_vector_is_zero_words() {
        let empty = VectorBuf::new();
        assert_eq!(word_len(&[empty.as_part()]), 0);
        assert_eq!(word_len(&[]), 0);
        // An all-zero dense container sets nothing.
        let mut zero = VectorBuf::new();
        zero.push_dense(3, &[0; CONTAINER_WORDS]).unwrap();
        assert_eq!(word_len(&[zero.as_part()]), 0);
        write_words(&[zero.as_part()], &mut []);
    }

    #[test]
    fn trailing_zero_words_are_trimmed_inside_a_dense_container() {
        let mut words = [0u64; CONTAINER_WORDS];
        words[10] = 1 << 63;
        let mut v = VectorBuf::new();
        v.push_dense(1, &words).unwrap();
        v.push_dense(2, &[0; CONTAINER_WORDS]).unwrap();
        let parts = [v.as_part()];
        assert_eq!(word_len(&parts), CONTAINER_WORDS + 11);
        let mut out = vec![u64::MAX; word_len(&parts)];
        write_words(&parts, &mut out);
        assert_eq!(bits_of_words(&out), vec![(1 << 16) + 10 * 64 + 63]);
    }

    #[test]
    fn the_highest_bit_makes_the_longest_form() {
        let v = VectorBuf::from_bits(vec![u32::MAX]);
        assert_eq!(word_len(&[v.as_part()]), 1 << 26);
    }

    proptest! {
        #[test]
        fn words_hold_exactly_the_union_of_the_parts(
            a in proptest::collection::vec(0u32..1 << 20, 0..2000),
            b in proptest::collection::vec(0u32..1 << 20, 0..50),
        ) {
            let (va, vb) = (VectorBuf::from_bits(a.clone()), VectorBuf::from_bits(b.clone()));
            let parts = [vb.as_part(), va.as_part()];
            let mut out = vec![u64::MAX; word_len(&parts)];
            write_words(&parts, &mut out);
            let mut expected: Vec<u32> = a.into_iter().chain(b).collect();
            expected.sort_unstable();
            expected.dedup();
            prop_assert_eq!(out.last().copied().unwrap_or(1) != 0, true);
            prop_assert_eq!(bits_of_words(&out), expected);
        }

        /// One vector split into parts by container key, as a union reply
        /// comes, in key order (each container copied once) and reversed
        /// (ORed in over what is written), over words left all ones.
        #[test]
        fn parts_split_by_key_in_either_order_write_the_vector(
            bits in proptest::collection::btree_set(0u32..1 << 22, 0..3000),
            dense in proptest::collection::vec(0u32..64, 0..6),
            cuts in proptest::collection::vec(0u16..64, 0..4),
        ) {
            // Whole containers set too, so some parts hold dense ones.
            let mut all = bits;
            for key in dense {
                all.extend((key << 16)..(key << 16) + 5000);
            }
            let mut cuts = cuts;
            cuts.push(64);
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0u32;
            for cut in cuts {
                let to = u32::from(cut) << 16;
                pieces.push(VectorBuf::from_bits(all.range(from..to).copied().collect()));
                from = to;
            }
            let expected: Vec<u32> = all.into_iter().collect();
            let mut parts: Vec<VectorPart<'_>> = pieces.iter().map(VectorBuf::as_part).collect();
            for _ in 0..2 {
                let mut out = vec![u64::MAX; word_len(&parts)];
                write_words(&parts, &mut out);
                prop_assert_eq!(bits_of_words(&out), expected.clone());
                parts.reverse();
            }
        }
    }
}
