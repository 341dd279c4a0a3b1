//! Word-level kernels: the bitwise hot path.
//!
//! OR of many word slices into one accumulator, AND of several, the fused
//! AND + popcount that counts an intersection without building it, and
//! popcount. Each kernel is one generic inner loop compiled three times: for
//! the baseline x86-64 (or whatever the target is), with AVX2, and with
//! AVX-512 (`avx512f` + `avx512vpopcntdq`, whose `vpopcntq` makes popcount a
//! single instruction per 8 words). The best variant the CPU supports is
//! chosen once at run time, so a portable binary runs at the speed of a
//! `target-cpu=native` one.
//!
//! Multi-source ORs fold four sources per pass
//! (`acc |= a | b | c | d`, so the accumulator is loaded and stored once per
//! four sources), 64 KiB of accumulator at a time so that the accumulator
//! stays in L2 while the sources stream from memory.
//!
//! The `_until_full` ORs check, after each pass, whether the accumulator
//! has become all ones, and stop there: the rest of the sources cannot
//! change it.
//!
//! The free functions use [`Kernels::best`]; [`Kernels::new`] picks a given
//! variant (tests run every variant the CPU has). Accumulators are any
//! `&mut [u64]`: no alignment beyond `u64` is assumed.

mod generic;

use std::sync::OnceLock;

/// An instruction set the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// The target's baseline (SSE2 on x86-64): the reference.
    Scalar,
    /// AVX2 and POPCNT.
    Avx2,
    /// AVX-512 F, BW, VL and VPOPCNTDQ.
    Avx512,
}

impl Isa {
    /// Every instruction set, from the most portable to the fastest.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// Whether this CPU can run the kernels compiled for `self`.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("popcnt")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_supported()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vpopcntdq")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The kernels compiled for one instruction set the CPU supports.
///
/// A `Kernels` exists only for a supported [`Isa`], which is what makes
/// calling its methods safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernels {
    isa: Isa,
}

/// Generates a module of kernels compiled with the given target features.
macro_rules! variant {
    ($name:ident, $features:literal) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use super::generic;

            #[target_feature(enable = $features)]
            pub(super) fn popcount(words: &[u64]) -> u64 {
                generic::popcount(words)
            }

            #[target_feature(enable = $features)]
            pub(super) fn or_into(acc: &mut [u64], src: &[u64]) {
                generic::or_into(acc, src)
            }

            #[target_feature(enable = $features)]
            pub(super) fn and_into(acc: &mut [u64], src: &[u64]) {
                generic::and_into(acc, src)
            }

            #[target_feature(enable = $features)]
            pub(super) fn or_many_into(acc: &mut [u64], srcs: &[&[u64]]) {
                generic::or_many_into(acc, srcs)
            }

            #[target_feature(enable = $features)]
            pub(super) fn write_or(out: &mut [u64], srcs: &[&[u64]]) {
                generic::write_or(out, srcs)
            }

            #[target_feature(enable = $features)]
            pub(super) fn or_many_until_full(acc: &mut [u64], srcs: &[&[u64]]) -> Option<usize> {
                generic::or_many_until_full(acc, srcs)
            }

            #[target_feature(enable = $features)]
            pub(super) fn write_or_until_full(out: &mut [u64], srcs: &[&[u64]]) -> Option<usize> {
                generic::write_or_until_full(out, srcs)
            }

            #[target_feature(enable = $features)]
            pub(super) fn and_many_into(acc: &mut [u64], srcs: &[&[u64]]) {
                generic::and_many_into(acc, srcs)
            }

            #[target_feature(enable = $features)]
            pub(super) fn write_and(out: &mut [u64], srcs: &[&[u64]]) {
                generic::write_and(out, srcs)
            }

            #[target_feature(enable = $features)]
            pub(super) fn and_count(inputs: &[&[u64]]) -> u64 {
                generic::and_count(inputs)
            }
        }
    };
}

variant!(avx2, "avx2,popcnt");
variant!(
    avx512,
    "avx512f,avx512bw,avx512vl,avx512vpopcntdq,avx2,popcnt"
);

/// Calls kernel `$f` of the variant `$k` holds.
macro_rules! dispatch {
    ($k:expr, $f:ident($($arg:expr),*)) => {
        match $k.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Kernels` holds `Avx2` only when the CPU supports
            // AVX2 and POPCNT (`Kernels::new` checks), the features `avx2::*`
            // is compiled with.
            Isa::Avx2 => unsafe { avx2::$f($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Kernels` holds `Avx512` only when the CPU supports
            // every feature `avx512::*` is compiled with (`Kernels::new` checks).
            Isa::Avx512 => unsafe { avx512::$f($($arg),*) },
            _ => generic::$f($($arg),*),
        }
    };
}

fn check_lengths(what: &str, len: usize, srcs: &[&[u64]]) {
    assert!(
        srcs.iter().all(|s| s.len() == len),
        "{what}: slices differ in length"
    );
}

impl Kernels {
    /// The fastest variant this CPU supports, detected once.
    pub fn best() -> Kernels {
        static BEST: OnceLock<Kernels> = OnceLock::new();
        *BEST.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .rev()
                .find_map(Kernels::new)
                .expect("the scalar kernels run everywhere")
        })
    }

    /// The variant compiled for `isa`, or `None` if this CPU cannot run it.
    pub fn new(isa: Isa) -> Option<Kernels> {
        isa.is_supported().then_some(Kernels { isa })
    }

    /// The instruction set of this variant.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Number of set bits in `words`.
    pub fn popcount(&self, words: &[u64]) -> u64 {
        dispatch!(self, popcount(words))
    }

    /// `acc[i] |= src[i]` for every word.
    ///
    /// # Panics
    ///
    /// If the slices differ in length.
    pub fn or_into(&self, acc: &mut [u64], src: &[u64]) {
        assert_eq!(acc.len(), src.len(), "or_into: slices differ in length");
        dispatch!(self, or_into(acc, src))
    }

    /// `acc[i] &= src[i]` for every word.
    ///
    /// # Panics
    ///
    /// If the slices differ in length.
    pub fn and_into(&self, acc: &mut [u64], src: &[u64]) {
        assert_eq!(acc.len(), src.len(), "and_into: slices differ in length");
        dispatch!(self, and_into(acc, src))
    }

    /// `acc[i] |= srcs[0][i] | srcs[1][i] | ...` for every word, four sources
    /// per pass over each 64 KiB of `acc`.
    ///
    /// # Panics
    ///
    /// If a source's length differs from `acc`'s.
    pub fn or_many_into(&self, acc: &mut [u64], srcs: &[&[u64]]) {
        check_lengths("or_many_into", acc.len(), srcs);
        dispatch!(self, or_many_into(acc, srcs))
    }

    /// `out[i] = srcs[0][i] | srcs[1][i] | ...` for every word (all zero for
    /// no sources); like [`Kernels::or_many_into`] without reading `out`.
    ///
    /// # Panics
    ///
    /// If a source's length differs from `out`'s.
    pub fn write_or(&self, out: &mut [u64], srcs: &[&[u64]]) {
        check_lengths("write_or", out.len(), srcs);
        dispatch!(self, write_or(out, srcs))
    }

    /// Like [`Kernels::or_many_into`], but stops once `acc` is all ones:
    /// passes over the whole of `acc` (meant for a window that stays in
    /// cache, such as 64 KiB) of one source, one, two, then four each,
    /// checking after each pass. Returns how
    /// many sources it read before `acc` became all ones, or `None` if it
    /// never did (it read them all). A union reads fewer inputs this way
    /// where their OR saturates.
    ///
    /// # Panics
    ///
    /// If a source's length differs from `acc`'s.
    pub fn or_many_until_full(&self, acc: &mut [u64], srcs: &[&[u64]]) -> Option<usize> {
        check_lengths("or_many_until_full", acc.len(), srcs);
        dispatch!(self, or_many_until_full(acc, srcs))
    }

    /// Like [`Kernels::or_many_until_full`], but overwrites `out` (as
    /// [`Kernels::write_or`] does) instead of ORing into it.
    ///
    /// # Panics
    ///
    /// If a source's length differs from `out`'s.
    pub fn write_or_until_full(&self, out: &mut [u64], srcs: &[&[u64]]) -> Option<usize> {
        check_lengths("write_or_until_full", out.len(), srcs);
        dispatch!(self, write_or_until_full(out, srcs))
    }

    /// `acc[i] &= srcs[0][i] & srcs[1][i] & ...` for every word.
    ///
    /// # Panics
    ///
    /// If a source's length differs from `acc`'s.
    pub fn and_many_into(&self, acc: &mut [u64], srcs: &[&[u64]]) {
        check_lengths("and_many_into", acc.len(), srcs);
        dispatch!(self, and_many_into(acc, srcs))
    }

    /// `out[i] = srcs[0][i] & srcs[1][i] & ...` for every word (all ones, the
    /// identity of AND, for no sources), without reading `out`.
    ///
    /// # Panics
    ///
    /// If a source's length differs from `out`'s.
    pub fn write_and(&self, out: &mut [u64], srcs: &[&[u64]]) {
        check_lengths("write_and", out.len(), srcs);
        dispatch!(self, write_and(out, srcs))
    }

    /// Number of bits set in the AND of equally long word slices, without
    /// building it; no slices at all counts zero.
    ///
    /// # Panics
    ///
    /// If the slices differ in length.
    pub fn and_count(&self, inputs: &[&[u64]]) -> u64 {
        if let Some(first) = inputs.first() {
            check_lengths("and_count", first.len(), inputs);
        }
        dispatch!(self, and_count(inputs))
    }
}

/// Whether every bit of `words` is set. Each 8-word chunk is ANDed
/// together before it is compared, a loop the compiler vectorizes, where a
/// word-by-word `all` is a scalar compare and branch per word: a full
/// container costs 128 steps, and one that is not stops at its first chunk
/// with a clear bit.
pub fn all_ones(words: &[u64]) -> bool {
    let (chunks, rest) = words.as_chunks::<8>();
    chunks
        .iter()
        .all(|chunk| chunk.iter().fold(u64::MAX, |a, &w| a & w) == u64::MAX)
        && rest.iter().all(|&w| w == u64::MAX)
}

/// Number of set bits in `words`.
pub fn popcount(words: &[u64]) -> u64 {
    Kernels::best().popcount(words)
}

/// `acc[i] |= src[i]` for every word.
///
/// # Panics
///
/// If the slices differ in length.
pub fn or_into(acc: &mut [u64], src: &[u64]) {
    Kernels::best().or_into(acc, src)
}

/// `acc[i] &= src[i]` for every word.
///
/// # Panics
///
/// If the slices differ in length.
pub fn and_into(acc: &mut [u64], src: &[u64]) {
    Kernels::best().and_into(acc, src)
}

/// `acc |= OR(srcs)`, word by word; see [`Kernels::or_many_into`].
///
/// # Panics
///
/// If a source's length differs from `acc`'s.
pub fn or_many_into(acc: &mut [u64], srcs: &[&[u64]]) {
    Kernels::best().or_many_into(acc, srcs)
}

/// `out = OR(srcs)`, word by word, all zero for no sources; see [`Kernels::write_or`].
///
/// # Panics
///
/// If a source's length differs from `out`'s.
pub fn write_or(out: &mut [u64], srcs: &[&[u64]]) {
    Kernels::best().write_or(out, srcs)
}

/// `acc &= AND(srcs)`, word by word; see [`Kernels::and_many_into`].
///
/// # Panics
///
/// If a source's length differs from `acc`'s.
pub fn and_many_into(acc: &mut [u64], srcs: &[&[u64]]) {
    Kernels::best().and_many_into(acc, srcs)
}

/// `out = AND(srcs)`, word by word, all ones for no sources; see [`Kernels::write_and`].
///
/// # Panics
///
/// If a source's length differs from `out`'s.
pub fn write_and(out: &mut [u64], srcs: &[&[u64]]) {
    Kernels::best().write_and(out, srcs)
}

/// Number of bits set in the AND of equally long word slices, without
/// building it; no slices at all counts zero.
///
/// # Panics
///
/// If the slices differ in length.
pub fn and_count(inputs: &[&[u64]]) -> u64 {
    Kernels::best().and_count(inputs)
}
