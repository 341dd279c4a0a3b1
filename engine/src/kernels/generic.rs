//! The kernels' inner loops, written once.
//!
//! Every function here is `#[inline(always)]`, so each variant that calls it
//! (plain, AVX2, AVX-512) gets its own copy compiled for its instruction set.
//! The loops are plain indexed loops over slices whose lengths the function
//! has made equal, which LLVM turns into vector code without bounds checks.
//! Callers have already checked that the lengths match.

/// Sources folded per pass over the accumulator: `acc |= a | b | c | d` loads
/// and stores each accumulator word once per four sources.
pub(super) const FUSE: usize = 4;

/// Words of the accumulator processed against every source before moving on
/// (64 KiB): large enough for the hardware prefetcher to stream each source,
/// small enough that the accumulator stays in L2 between passes.
pub(super) const BLOCK: usize = 8192;

/// Words ANDed at a time on the stack when counting the AND of many slices.
const COUNT_BLOCK: usize = 1024;

#[inline(always)]
pub(super) fn popcount(words: &[u64]) -> u64 {
    words.iter().map(|w| u64::from(w.count_ones())).sum()
}

#[inline(always)]
pub(super) fn or_into(acc: &mut [u64], src: &[u64]) {
    let src = &src[..acc.len()];
    for (i, a) in acc.iter_mut().enumerate() {
        *a |= src[i];
    }
}

#[inline(always)]
pub(super) fn and_into(acc: &mut [u64], src: &[u64]) {
    let src = &src[..acc.len()];
    for (i, a) in acc.iter_mut().enumerate() {
        *a &= src[i];
    }
}

/// `acc = OR(srcs)` if `WRITE`, else `acc |= OR(srcs)`, for exactly `N` sources.
#[inline(always)]
fn or_n<const N: usize, const WRITE: bool>(acc: &mut [u64], srcs: &[&[u64]]) {
    let srcs: [&[u64]; N] = std::array::from_fn(|s| &srcs[s][..acc.len()]);
    for (i, a) in acc.iter_mut().enumerate() {
        let mut v = if WRITE { 0 } else { *a };
        for src in &srcs {
            v |= src[i];
        }
        *a = v;
    }
}

/// `acc = AND(srcs)` if `WRITE`, else `acc &= AND(srcs)`, for exactly `N` sources.
#[inline(always)]
fn and_n<const N: usize, const WRITE: bool>(acc: &mut [u64], srcs: &[&[u64]]) {
    let srcs: [&[u64]; N] = std::array::from_fn(|s| &srcs[s][..acc.len()]);
    for (i, a) in acc.iter_mut().enumerate() {
        let mut v = if WRITE { u64::MAX } else { *a };
        for src in &srcs {
            v &= src[i];
        }
        *a = v;
    }
}

/// One pass of up to [`FUSE`] sources over `acc` (a block): OR if `!AND`.
#[inline(always)]
fn group<const AND: bool, const WRITE: bool>(acc: &mut [u64], group: &[&[u64]]) {
    match (AND, group.len()) {
        (false, 0) if WRITE => acc.fill(0),
        (true, 0) if WRITE => acc.fill(u64::MAX),
        (_, 0) => {}
        (false, 1) => or_n::<1, WRITE>(acc, group),
        (false, 2) => or_n::<2, WRITE>(acc, group),
        (false, 3) => or_n::<3, WRITE>(acc, group),
        (false, _) => or_n::<4, WRITE>(acc, group),
        (true, 1) => and_n::<1, WRITE>(acc, group),
        (true, 2) => and_n::<2, WRITE>(acc, group),
        (true, 3) => and_n::<3, WRITE>(acc, group),
        (true, _) => and_n::<4, WRITE>(acc, group),
    }
}

/// The sources' words `start..start + len`, for up to [`FUSE`] sources.
#[inline(always)]
fn window<'a>(group: &[&'a [u64]], start: usize, len: usize) -> ([&'a [u64]; FUSE], usize) {
    let mut out = [&[][..]; FUSE];
    for (o, src) in out.iter_mut().zip(group) {
        *o = &src[start..start + len];
    }
    (out, group.len())
}

/// Folds every source into `acc` (OR, or AND if `AND`) block by block,
/// [`FUSE`] sources per pass; the first pass overwrites `acc` if `WRITE`.
#[inline(always)]
fn fold_blocks<const AND: bool, const WRITE: bool>(acc: &mut [u64], srcs: &[&[u64]]) {
    let mut start = 0;
    for block in acc.chunks_mut(BLOCK) {
        let len = block.len();
        let mut groups = srcs.chunks(FUSE);
        let (w, n) = window(groups.next().unwrap_or(&[]), start, len);
        group::<AND, WRITE>(block, &w[..n]);
        for g in groups {
            let (w, n) = window(g, start, len);
            group::<AND, false>(block, &w[..n]);
        }
        start += len;
    }
}

#[inline(always)]
pub(super) fn or_many_into(acc: &mut [u64], srcs: &[&[u64]]) {
    fold_blocks::<false, false>(acc, srcs);
}

#[inline(always)]
pub(super) fn write_or(out: &mut [u64], srcs: &[&[u64]]) {
    fold_blocks::<false, true>(out, srcs);
}

#[inline(always)]
pub(super) fn and_many_into(acc: &mut [u64], srcs: &[&[u64]]) {
    fold_blocks::<true, false>(acc, srcs);
}

#[inline(always)]
pub(super) fn write_and(out: &mut [u64], srcs: &[&[u64]]) {
    fold_blocks::<true, true>(out, srcs);
}

/// `acc = OR(srcs)` if `WRITE`, else `acc |= OR(srcs)`, for exactly `N`
/// sources; whether `acc` is now all ones.
#[inline(always)]
fn or_n_full<const N: usize, const WRITE: bool>(acc: &mut [u64], srcs: &[&[u64]]) -> bool {
    let srcs: [&[u64]; N] = std::array::from_fn(|s| &srcs[s][..acc.len()]);
    let mut all = u64::MAX;
    for (i, a) in acc.iter_mut().enumerate() {
        let mut v = if WRITE { 0 } else { *a };
        for src in &srcs {
            v |= src[i];
        }
        *a = v;
        all &= v;
    }
    all == u64::MAX
}

/// One OR pass of up to [`FUSE`] sources over the whole of `acc`; whether
/// `acc` is now all ones.
#[inline(always)]
fn or_group_full<const WRITE: bool>(acc: &mut [u64], group: &[&[u64]]) -> bool {
    match group.len() {
        0 if WRITE => {
            acc.fill(0);
            acc.is_empty()
        }
        0 => acc.iter().all(|&w| w == u64::MAX),
        1 => or_n_full::<1, WRITE>(acc, group),
        2 => or_n_full::<2, WRITE>(acc, group),
        3 => or_n_full::<3, WRITE>(acc, group),
        _ => or_n_full::<4, WRITE>(acc, group),
    }
}

/// ORs `srcs` into `acc` (overwriting it first if `WRITE`) in passes over
/// the whole of `acc` of one source, one, two, then [`FUSE`] each (a
/// saturating OR often needs only its first one or two sources), and stops
/// after the first pass that leaves `acc` all ones: the number of sources
/// read then, or `None` if it never was (every source was read).
#[inline(always)]
fn or_until_full<const WRITE: bool>(acc: &mut [u64], srcs: &[&[u64]]) -> Option<usize> {
    let mut read = srcs.len().min(1);
    if or_group_full::<WRITE>(acc, &srcs[..read]) {
        return Some(read);
    }
    let mut pass = 1;
    while read < srcs.len() {
        let end = srcs.len().min(read + pass);
        if or_group_full::<false>(acc, &srcs[read..end]) {
            return Some(end);
        }
        read = end;
        pass = FUSE.min(2 * pass);
    }
    None
}

#[inline(always)]
pub(super) fn or_many_until_full(acc: &mut [u64], srcs: &[&[u64]]) -> Option<usize> {
    or_until_full::<false>(acc, srcs)
}

#[inline(always)]
pub(super) fn write_or_until_full(out: &mut [u64], srcs: &[&[u64]]) -> Option<usize> {
    or_until_full::<true>(out, srcs)
}

/// Bits set in the AND of exactly `N` equally long slices.
#[inline(always)]
fn and_count_n<const N: usize>(inputs: &[&[u64]]) -> u64 {
    let len = inputs[0].len();
    let srcs: [&[u64]; N] = std::array::from_fn(|s| &inputs[s][..len]);
    let mut count = 0;
    for i in 0..len {
        let mut v = srcs[0][i];
        for src in &srcs[1..] {
            v &= src[i];
        }
        count += u64::from(v.count_ones());
    }
    count
}

#[inline(always)]
pub(super) fn and_count(inputs: &[&[u64]]) -> u64 {
    match inputs.len() {
        0 => 0,
        1 => popcount(inputs[0]),
        2 => and_count_n::<2>(inputs),
        3 => and_count_n::<3>(inputs),
        4 => and_count_n::<4>(inputs),
        _ => {
            let len = inputs[0].len();
            let mut buf = [0u64; COUNT_BLOCK];
            let mut count = 0;
            let mut start = 0;
            while start < len {
                let n = COUNT_BLOCK.min(len - start);
                let acc = &mut buf[..n];
                let mut groups = inputs.chunks(FUSE);
                let (w, k) = window(groups.next().unwrap_or(&[]), start, n);
                group::<true, true>(acc, &w[..k]);
                for g in groups {
                    let (w, k) = window(g, start, n);
                    group::<true, false>(acc, &w[..k]);
                }
                count += popcount(acc);
                start += n;
            }
            count
        }
    }
}
