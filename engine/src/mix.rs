//! Two fixed 64-bit mixers, written once for every crate that needs them:
//! [`fmix64`], which places vectors and hashes vids, and [`SplitMix64`], the
//! seeded generator of the sample, the benchmark data set and test data.
//!
//! Both are fixed forever: placement, the committed sample and benchmark
//! data sets all change if either does.
//!
//! ```
//! use bitfold_engine::mix::{SplitMix64, fmix64};
//!
//! assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
//! let mut a = SplitMix64(7);
//! let mut b = SplitMix64(7);
//! assert_eq!(a.next_u64(), b.next_u64());
//! ```

/// The 64-bit finaliser of MurmurHash3 (`fmix64`): a bijective mixer.
pub fn fmix64(mut key: u64) -> u64 {
    key ^= key >> 33;
    key = key.wrapping_mul(0xff51_afd7_ed55_8ccd);
    key ^= key >> 33;
    key = key.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    key ^ (key >> 33)
}

/// The splitmix64 generator, seeded with its state (any value): tiny and
/// fixed, so data generated from a seed is the same on every machine and
/// never changes with a dependency.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        SplitMix64::finalise(self.0)
    }

    /// A number in `0..n` by remainder (`n > 0`; slightly biased unless `n`
    /// is a power of two).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// splitmix64's output function (a bijective mixer of its own), also
    /// useful to derive the seeds of independent streams.
    pub fn finalise(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mixers_are_the_published_ones() {
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        // The first output of splitmix64 seeded with 0.
        assert_eq!(SplitMix64(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }
}
