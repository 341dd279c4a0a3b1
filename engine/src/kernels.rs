//! Word-level kernels: the bitwise hot path.
//!
//! Scalar reference versions for now; the dispatched SIMD variants replace
//! the bodies behind the same signatures.

/// Number of set bits in `words`.
pub fn popcount(words: &[u64]) -> u64 {
    words.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// `acc[i] |= src[i]` for every word.
///
/// # Panics
///
/// If the slices differ in length.
pub fn or_into(acc: &mut [u64], src: &[u64]) {
    assert_eq!(acc.len(), src.len(), "or_into: slices differ in length");
    for (a, s) in acc.iter_mut().zip(src) {
        *a |= s;
    }
}

/// `acc[i] &= src[i]` for every word.
///
/// # Panics
///
/// If the slices differ in length.
pub fn and_into(acc: &mut [u64], src: &[u64]) {
    assert_eq!(acc.len(), src.len(), "and_into: slices differ in length");
    for (a, s) in acc.iter_mut().zip(src) {
        *a &= s;
    }
}

/// Number of bits set in the AND of equally long word slices, without
/// building it; no slices at all counts zero.
///
/// # Panics
///
/// If the slices differ in length.
pub fn and_count(inputs: &[&[u64]]) -> u64 {
    let Some((first, rest)) = inputs.split_first() else {
        return 0;
    };
    assert!(
        rest.iter().all(|r| r.len() == first.len()),
        "and_count: slices differ in length"
    );
    (0..first.len())
        .map(|i| u64::from(rest.iter().fold(first[i], |acc, r| acc & r[i]).count_ones()))
        .sum()
}
