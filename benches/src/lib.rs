//! Workloads for bitfold's benchmarks: the same seeded random vectors as
//! bitfold parts and as roaring-rs bitmaps, and the memory-bandwidth roof
//! (a plain sequential read of the same bytes).
//!
//! The benchmarks themselves are in `benches/kernels.rs`; `README.md` has
//! the measured table and the command that reproduces it.
//!
//! The side-by-side comparison with Redis and roaring-rs (`src/bin/compare`)
//! runs the range-query workload of `bitfold-workload`, as `bitfold bench` does.
//!
//! ```
//! let w = bitfold_benches::Workload::new(3, 20, 0.01, 7);
//! assert_eq!(w.vectors.len(), 3);
//! assert_eq!(w.roaring[0].len(), w.vectors[0].as_part().cardinality());
//! ```
#![deny(missing_docs)]

use bitfold_engine::fold::UnionPlan;
use bitfold_engine::{CONTAINER_BITS, CONTAINER_WORDS, VectorBuf, VectorPart};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use roaring::RoaringBitmap;

/// The union workloads: (vectors, log2 of their width in bits).
pub const SHAPES: [(usize, u32); 3] = [(64, 20), (512, 20), (16, 26)];

/// The densities: (label, probability of each bit).
pub const DENSITIES: [(&str, f64); 3] = [("50%", 0.5), ("1%", 0.01), ("0.01%", 0.0001)];

/// The union the system computes: plan, then fill each output part into a
/// buffer the caller owns (a reused message buffer in the real system);
/// `out` must hold the largest part. Returns a word that depends on the result.
pub fn union(inputs: &[VectorPart<'_>], out: &mut [u64]) -> u64 {
    let plan = UnionPlan::new(inputs);
    let mut check = 0;
    for (i, part) in plan.parts().iter().enumerate() {
        let words = &mut out[..part.dense_word_count()];
        plan.fill(i, inputs, words);
        check ^= words.first().copied().unwrap_or(0) ^ part.sparse_values().len() as u64;
    }
    check
}

/// The same vectors in both libraries' forms.
pub struct Workload {
    /// bitfold's form; containers dense or sparse as `SPARSE_MAX` says.
    pub vectors: Vec<VectorBuf>,
    /// roaring-rs's form, with the same bits.
    pub roaring: Vec<RoaringBitmap>,
}

impl Workload {
    /// `count` vectors over bits `0..2^width_log2` (at least one container),
    /// each bit set with probability `density`, from RNG seed `seed`.
    pub fn new(count: usize, width_log2: u32, density: f64, seed: u64) -> Workload {
        let mut rng = StdRng::seed_from_u64(seed);
        let containers = 1usize << width_log2.saturating_sub(16);
        let (vectors, roaring) = (0..count)
            .map(|_| random_vector(&mut rng, containers, density))
            .unzip();
        Workload { vectors, roaring }
    }

    /// The vectors as parts.
    pub fn parts(&self) -> Vec<VectorPart<'_>> {
        self.vectors.iter().map(VectorBuf::as_part).collect()
    }

    /// Bytes of the vectors in bitfold's form (dense words and sparse
    /// values): the throughput every benchmark of this workload reports.
    pub fn input_bytes(&self) -> u64 {
        self.vectors
            .iter()
            .map(|v| {
                let p = v.as_part();
                (p.dense_words().len() * 8 + p.sparse_values().len() * 2) as u64
            })
            .sum()
    }
}

fn random_vector(rng: &mut StdRng, containers: usize, density: f64) -> (VectorBuf, RoaringBitmap) {
    if density >= 0.25 {
        // Dense: random words with each bit set with probability 1/2.
        assert_eq!(density, 0.5, "dense workloads are 50% dense");
        let words: Vec<u64> = (0..containers * CONTAINER_WORDS)
            .map(|_| rng.random())
            .collect();
        let mut buf = VectorBuf::new();
        for (key, container) in words.chunks_exact(CONTAINER_WORDS).enumerate() {
            buf.push_dense(key as u16, container.try_into().expect("1024 words"))
                .expect("keys ascend");
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        return (buf, RoaringBitmap::from_lsb0_bytes(0, &bytes));
    }
    let mean = density * CONTAINER_BITS as f64;
    let mut bits = Vec::new();
    let mut lows = Vec::new();
    for key in 0..containers as u32 {
        let count = mean as usize + usize::from(rng.random_bool(mean.fract()));
        lows.clear();
        lows.extend((0..count).map(|_| rng.random::<u16>()));
        lows.sort_unstable();
        lows.dedup();
        bits.extend(lows.iter().map(|&low| key << 16 | u32::from(low)));
    }
    let roaring = RoaringBitmap::from_sorted_iter(bits.iter().copied()).expect("bits are sorted");
    (VectorBuf::from_sorted_bits(&bits), roaring)
}

/// XOR of every word: a sequential read that the compiler cannot skip.
pub fn xor_reduce(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let tail = chunks.remainder().iter().fold(0, |a, w| a ^ w);
    for chunk in chunks {
        for (lane, w) in lanes.iter_mut().zip(chunk) {
            *lane ^= w;
        }
    }
    lanes.iter().fold(tail, |a, l| a ^ l)
}

/// Reads every byte of `parts` (dense words, then sparse values) once, on
/// the current thread: the memory-bandwidth roof of a fold over them.
pub fn read_roof(parts: &[VectorPart<'_>]) -> u64 {
    parts.iter().fold(0, |acc, p| acc ^ read_part(p))
}

/// [`read_roof`] split across the rayon pool.
pub fn read_roof_parallel(parts: &[VectorPart<'_>]) -> u64 {
    if parts.len() >= rayon::current_num_threads() {
        return parts.par_iter().map(read_part).reduce(|| 0, |a, b| a ^ b);
    }
    // Few long vectors: split each one's words.
    parts
        .iter()
        .map(|p| {
            let values = p.sparse_values().iter().fold(0, |a, &v| a ^ u64::from(v));
            p.dense_words()
                .par_chunks(1 << 16)
                .map(xor_reduce)
                .reduce(|| 0, |a, b| a ^ b)
                ^ values
        })
        .fold(0, |a, b| a ^ b)
}

fn read_part(part: &VectorPart<'_>) -> u64 {
    let values = part
        .sparse_values()
        .iter()
        .fold(0, |a, &v| a ^ u64::from(v));
    xor_reduce(part.dense_words()) ^ values
}
