//! The range-query benchmark's data set and queries, generated from a seed:
//! the same on every run and for every system measured (bitfold, Redis,
//! roaring-rs).
//!
//! Vector `i` of a [`DataSet`] has vid `first_vid + i`; each of its bits
//! `0..bits` is set independently with probability `density`. A [`Query`]
//! ANDs terms, each the OR of a run of consecutive vids.

use std::ops::Range;

use bitfold_engine::mix::SplitMix64;
use bitfold_engine::{CONTAINER_BITS, CONTAINER_WORDS, VectorBuf, VectorPart};

/// A generated data set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DataSet {
    /// How many vectors.
    pub vectors: u64,
    /// Bits per vector: positions `0..bits` (at most 2^32).
    pub bits: u64,
    /// The probability that a bit is set, in `(0, 1]`.
    pub density: f64,
    /// The generator's seed.
    pub seed: u64,
    /// The vid of vector 0.
    pub first_vid: u64,
}

/// Densities from this one up are generated word by word, rounded to a
/// multiple of 2^-16; sparser ones exactly, by drawing the gaps between bits.
const WORDWISE_DENSITY: f64 = 1.0 / 64.0;

impl DataSet {
    /// Checks that the data set can be generated and named by vids.
    pub fn check(&self) -> Result<(), String> {
        if self.vectors == 0 {
            return Err("the data set needs at least one vector".into());
        }
        if self.bits == 0 || self.bits > 1 << 32 {
            return Err(format!(
                "{} bits per vector: it must be between 1 and 2^32",
                self.bits
            ));
        }
        if !(self.density > 0.0 && self.density <= 1.0) {
            return Err(format!("density {} is outside (0, 1]", self.density));
        }
        if self.first_vid.checked_add(self.vectors - 1).is_none() {
            return Err(format!(
                "{} vectors from vid {} run past the largest vid",
                self.vectors, self.first_vid
            ));
        }
        Ok(())
    }

    /// The vid of vector `index`.
    pub fn vid(&self, index: u64) -> u64 {
        self.first_vid + index
    }

    /// The vids of all vectors, ascending.
    pub fn vids(&self) -> Vec<u64> {
        (0..self.vectors).map(|i| self.vid(i)).collect()
    }

    /// Vector `index`, the same for the same seed on every machine.
    pub fn vector(&self, index: u64) -> VectorBuf {
        let mut rng = SplitMix64(SplitMix64::finalise(
            self.seed ^ SplitMix64::finalise(index),
        ));
        if self.density >= WORDWISE_DENSITY {
            wordwise(&mut rng, self.bits, self.density)
        } else {
            by_gaps(&mut rng, self.bits, self.density)
        }
    }
}

/// Each word from random words combined so that each bit is set with
/// probability `density` rounded to 16 binary digits.
fn wordwise(rng: &mut SplitMix64, bits: u64, density: f64) -> VectorBuf {
    let scaled = (density * 65536.0).round() as u32;
    let mut buf = VectorBuf::new();
    let mut words = [0u64; CONTAINER_WORDS];
    let containers = bits.div_ceil(CONTAINER_BITS as u64);
    for key in 0..containers {
        let container_bits = (bits - key * CONTAINER_BITS as u64).min(CONTAINER_BITS as u64);
        for (w, word) in words.iter_mut().enumerate() {
            let first = w as u64 * 64;
            *word = if first >= container_bits {
                0
            } else {
                let value = biased_word(rng, scaled);
                let valid = container_bits - first;
                if valid >= 64 {
                    value
                } else {
                    value & ((1u64 << valid) - 1)
                }
            };
        }
        buf.push_words(key as u16, &words)
            .expect("keys ascend from 0");
    }
    buf
}

/// A word whose bits are each set with probability `scaled / 65536`: read
/// the binary digits of the probability from the last one up, ORing a
/// random word in for a 1 and ANDing one in for a 0.
fn biased_word(rng: &mut SplitMix64, scaled: u32) -> u64 {
    if scaled >= 1 << 16 {
        return u64::MAX;
    }
    if scaled == 0 {
        return 0;
    }
    let mut word = 0;
    for digit in scaled.trailing_zeros()..16 {
        let random = rng.next_u64();
        word = if scaled & (1 << digit) != 0 {
            word | random
        } else {
            word & random
        };
    }
    word
}

/// Bits drawn exactly: the gap before the next set bit is geometric.
fn by_gaps(rng: &mut SplitMix64, bits: u64, density: f64) -> VectorBuf {
    let scale = 1.0 / (1.0 - density).ln();
    let mut positions = Vec::with_capacity((bits as f64 * density * 1.1) as usize + 16);
    let mut next: u64 = 0;
    loop {
        // Uniform in (0, 1]: the logarithm is finite.
        let uniform = ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let gap = (uniform.ln() * scale).floor();
        if gap >= (bits - next) as f64 {
            break;
        }
        next += gap as u64;
        positions.push(next as u32);
        next += 1;
        if next >= bits {
            break;
        }
    }
    VectorBuf::from_sorted_bits(&positions)
}

/// Bytes of a vector in bitfold's form that a fold reads: dense words and
/// sparse positions.
pub fn part_bytes(part: &VectorPart<'_>) -> u64 {
    (part.dense_words().len() * 8 + part.sparse_values().len() * 2) as u64
}

/// The shape of every query of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Terms ANDed.
    pub terms: usize,
    /// Consecutive vids ORed by each term.
    pub vids_per_term: usize,
}

/// One query: each term is a run of positions in the ascending vid list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The terms, as ranges of indexes into the vid list.
    pub terms: Vec<Range<usize>>,
}

impl Query {
    /// The query message for the master: `R:a-b&c-d...` over `vids`.
    pub fn message(&self, vids: &[u64]) -> String {
        let terms: Vec<String> = self
            .terms
            .iter()
            .map(|t| format!("{}-{}", vids[t.start], vids[t.end - 1]))
            .collect();
        format!("R:{}", terms.join("&"))
    }

    /// Bytes of the vectors the query names (a vector named by two terms
    /// counts twice): what a system must read to answer it. `sizes[i]` is
    /// the size of the vector at index `i` of the vid list.
    pub fn bytes(&self, sizes: &[u64]) -> u64 {
        self.terms
            .iter()
            .map(|t| sizes[t.clone()].iter().sum::<u64>())
            .sum()
    }
}

/// `count` queries of `shape` over a list of `vids` vids, from `seed`.
pub fn queries(vids: usize, shape: Shape, count: usize, seed: u64) -> Result<Vec<Query>, String> {
    if shape.terms == 0 {
        return Err("a query needs at least one term".into());
    }
    if shape.vids_per_term == 0 {
        return Err("a term needs at least one vid".into());
    }
    if shape.vids_per_term > vids {
        return Err(format!(
            "{} vids per term, but the data set has only {vids} vectors",
            shape.vids_per_term
        ));
    }
    let starts = (vids - shape.vids_per_term + 1) as u64;
    let mut rng = SplitMix64(SplitMix64::finalise(seed ^ 0x7175_6572_7965_7321));
    Ok((0..count)
        .map(|_| Query {
            terms: (0..shape.terms)
                .map(|_| {
                    let start = (rng.next_u64() % starts) as usize;
                    start..start + shape.vids_per_term
                })
                .collect(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(vectors: u64, bits: u64, density: f64) -> DataSet {
        DataSet {
            vectors,
            bits,
            density,
            seed: 7,
            first_vid: 100,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_vectors_and_queries() {
        let set = data(4, 1 << 18, 0.01);
        assert_eq!(set.vector(2), set.vector(2));
        assert_ne!(set.vector(2), set.vector(3));
        let other = DataSet { seed: 8, ..set };
        assert_ne!(set.vector(2), other.vector(2));
        let shape = Shape {
            terms: 3,
            vids_per_term: 2,
        };
        assert_eq!(queries(4, shape, 50, 1), queries(4, shape, 50, 1));
        assert_ne!(queries(4, shape, 50, 1), queries(4, shape, 50, 2));
    }

    #[test]
    fn densities_come_out_as_asked() {
        for (density, bits) in [
            (0.5, 1 << 20),
            (0.01, 1 << 20),
            (0.3, 1 << 18),
            (0.0001, 1 << 24),
        ] {
            let set = data(1, bits, density);
            let got = set.vector(0).as_part().cardinality() as f64 / bits as f64;
            // Far more than 5 standard deviations of a binomial count.
            let tolerance = 6.0 * (density * (1.0 - density) / bits as f64).sqrt() + 1.0 / 65536.0;
            assert!(
                (got - density).abs() < tolerance,
                "asked {density}, got {got}"
            );
        }
        assert_eq!(data(1, 1000, 1.0).vector(0).as_part().cardinality(), 1000);
    }

    #[test]
    fn no_bit_at_or_past_the_width() {
        for density in [0.5, 0.001] {
            for bits in [1, 63, 64, 65, 70_000, 1 << 17] {
                let vector = data(1, bits, density).vector(0);
                assert!(
                    vector.as_part().bits().all(|b| u64::from(b) < bits),
                    "{bits} bits at {density}"
                );
            }
        }
        let widest = data(1, 1 << 32, 1e-5).vector(0);
        assert!(widest.as_part().bits().last().unwrap() > 1 << 31);
    }

    #[test]
    fn queries_stay_inside_the_vid_list_and_name_runs() {
        let shape = Shape {
            terms: 3,
            vids_per_term: 5,
        };
        let list = queries(12, shape, 200, 3).unwrap();
        assert!(list.iter().all(|q| q.terms.len() == 3));
        for term in list.iter().flat_map(|q| &q.terms) {
            assert_eq!(term.len(), 5);
            assert!(term.end <= 12);
        }
        let starts: std::collections::BTreeSet<usize> = list
            .iter()
            .flat_map(|q| q.terms.iter().map(|t| t.start))
            .collect();
        assert_eq!(starts.len(), 8, "every start 0..=7 is used");
        let vids = data(12, 64, 0.5).vids();
        let query = Query {
            terms: vec![0..5, 7..12],
        };
        assert_eq!(query.message(&vids), "R:100-104&107-111");
        assert_eq!(query.bytes(&[1; 12]), 10);
    }

    #[test]
    fn impossible_workloads_are_refused() {
        let shape = |terms, vids_per_term| Shape {
            terms,
            vids_per_term,
        };
        assert!(queries(10, shape(0, 1), 1, 0).unwrap_err().contains("term"));
        assert!(queries(10, shape(1, 0), 1, 0).unwrap_err().contains("vid"));
        assert!(
            queries(10, shape(1, 11), 1, 0)
                .unwrap_err()
                .contains("only 10")
        );
        assert!(data(0, 64, 0.5).check().is_err());
        assert!(data(1, (1 << 32) + 1, 0.5).check().is_err());
        assert!(data(1, 64, 0.0).check().is_err());
        let past_the_end = DataSet {
            first_vid: u64::MAX,
            ..data(2, 64, 0.5)
        };
        assert!(past_the_end.check().unwrap_err().contains("largest vid"));
        assert!(data(3, 64, 0.5).check().is_ok());
    }
}
