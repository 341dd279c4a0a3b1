//! The form a query's answer is asked for and arrives in (docs/protocol.md §3).

use bytes::Bytes;

/// The form of a query's answer (docs/protocol.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Format {
    /// The dense little-endian `u64` words, trailing zero words trimmed.
    Words,
    /// The portable Roaring serialization.
    Roaring,
    /// Only the number of set bits.
    Count,
}

/// A query's answer, in the form asked for.
///
/// A vector's bytes are those it arrived in, not a copy, when the answer is
/// large (64 KiB or more): the [`Bytes`] keeps the master's reply alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The dense words as bytes (a multiple of 8; empty for the empty vector).
    Words(Bytes),
    /// The portable Roaring serialization.
    Roaring(Bytes),
    /// The number of set bits.
    Count(u64),
}
