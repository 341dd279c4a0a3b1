//! The form a query's answer is asked for and arrives in (docs/protocol.md §3).

use std::fmt;

use bitfold_proto::names::{self, Named};
use bytes::Bytes;

/// The form of a query's answer (docs/protocol.md §3; [`Format::NAMES`]
/// says what each holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `words`.
    Words,
    /// `roaring`.
    Roaring,
    /// `count`.
    Count,
}

impl Format {
    /// Every form, with its name (what [`fmt::Display`] writes) and what it
    /// holds.
    pub const NAMES: [Named<Self>; 3] = [
        (
            Format::Words,
            "words",
            "The dense little-endian u64 words, trailing zero words trimmed",
        ),
        (
            Format::Roaring,
            "roaring",
            "The portable Roaring serialization",
        ),
        (Format::Count, "count", "Only the number of set bits"),
    ];
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(names::name_of(&Self::NAMES, *self))
    }
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
