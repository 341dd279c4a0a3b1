//! One container of a vector, borrowed: [`ContainerRef`], and the walk over
//! its set positions.

use std::fmt;

use super::DenseContainer;

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
