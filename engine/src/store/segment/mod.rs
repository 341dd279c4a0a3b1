//! Segment files: many vectors, each one [`VectorPart`] whose slices are read
//! straight out of the file's map.
//!
//! ```text
//! vector data   for each vector, in vid order:
//!                 dense words   u64 × 1024 per dense container (starts 64-byte aligned)
//!                 sparse ends   u32 × sparse containers
//!                 dense keys    u16 × dense containers
//!                 sparse keys   u16 × sparse containers
//!                 sparse values u16 × values
//! aggregates    the same five slices for each range aggregate
//! index         (8-byte aligned) one entry per record, ascending vid:
//!                 vid u64 | offset u64 | dense u32 | sparse u32 | values u32 | kind u32
//! aggregate index  one entry per aggregate, ascending (level, block):
//!                 block u64 | offset u64 | dense u32 | sparse u32 | values u32 | level u32
//! trailer       index offset u64 | record count u64 | aggregate count u64 | flags u64
//! footer        see `footer.rs`
//! ```
//!
//! A record's `kind` ([`RecordKind`]) says how it combines with the older
//! records of its vid: `set` (0) adds bits, `base` (1) is the whole vector
//! as of this record, `deleted` (2) ends the vector, `keep` (3) changes
//! nothing but says the vector exists (see `flags`). A `set` record has at
//! least one container, `deleted` and `keep` none, `base` any number.
//! Bit 0 of `flags` ([`COVERS_OLDER`]) marks a segment written by an
//! update: each of its aggregates is the union of every vector existing in
//! the block as of the segment, older segments' parts included, and the
//! segment has a record for each of those vectors (`keep` where unchanged).
//!
//! `offset` is where the vector's words start (or its ends, if it has no
//! dense container); the other slices follow back to back, each naturally
//! aligned because the slice before it ends on a multiple of its alignment.
//!
//! An aggregate is the union of the vectors this segment holds in one
//! aligned block of vids (see `aggregate.rs`); `block` is the block's first
//! vid; `level` indexes `AGGREGATE_LEVELS` (4, 16, 256 and 4,096 vids).
//! Format version 1 has no aggregates and a trailer without their count,
//! version 2 no flags and only `set` records (its kind field is zero);
//! versions 2 and 3 have no 4-vid level, their `level` 0 is 16 vids. All
//! are still read.
//! All integers are little-endian, which is why bitfold builds only for
//! little-endian targets.
//!
//! This file holds the format: its constants, the file names and the index
//! entry shared by vectors and aggregates. `reader.rs` opens and verifies a
//! segment ([`Segment`]); `writer.rs` writes one ([`SegmentWriter`]).

mod reader;
mod writer;

use std::ops::Range;

use super::footer::Kind;
use crate::vector::CONTAINER_WORDS;

pub(crate) use reader::Segment;
pub(crate) use writer::SegmentWriter;

#[cfg(not(target_endian = "little"))]
compile_error!("bitfold's store files are little-endian words read in place");

pub(crate) const SEGMENT: Kind = Kind {
    magic: *b"BFOLDSEG",
    version: 4,
    name: "segment",
};

/// Trailer flag: the segment's aggregates cover every vector existing in
/// their block as of the segment, not only its own records.
pub(crate) const COVERS_OLDER: u64 = 1;

/// How a record combines with the older records of its vid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordKind {
    /// Adds its bits to the vector (creating it if it does not exist).
    Set = 0,
    /// The vector is exactly these bits plus newer records; older records
    /// do not count. Exists even when empty.
    Base = 1,
    /// The vector does not exist as of this record.
    Deleted = 2,
    /// Changes nothing; written by an update for an existing vector of a
    /// block whose aggregates it rebuilt.
    Keep = 3,
}

impl RecordKind {
    fn from_field(field: u32) -> Option<RecordKind> {
        [
            RecordKind::Set,
            RecordKind::Base,
            RecordKind::Deleted,
            RecordKind::Keep,
        ]
        .into_iter()
        .find(|kind| *kind as u32 == field)
    }

    /// Whether older records of the vid no longer count.
    pub(crate) fn ends_chain(self) -> bool {
        matches!(self, RecordKind::Base | RecordKind::Deleted)
    }
}

/// The oldest segment format version this build reads (version 1 has no
/// aggregates).
const OLDEST_VERSION: u32 = 1;

/// Words of one index entry.
const ENTRY_WORDS: usize = 4;

/// Bytes of the trailer before the footer, by format version (1, 2, then 3
/// and later).
fn trailer_len(version: u32) -> usize {
    match version {
        1 => 16,
        2 => 24,
        _ => 32,
    }
}

/// Alignment of a vector's dense words in the file (a cache line).
const DENSE_ALIGN: u64 = 64;

/// The file name of segment `id`.
pub(crate) fn segment_name(id: u64) -> String {
    format!("seg-{id:016x}.bfseg")
}

/// The id of a segment file name, if `name` is one.
pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("seg-")?.strip_suffix(".bfseg")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// One index entry.
#[derive(Debug, Clone, Copy)]
struct Entry {
    vid: u64,
    offset: u64,
    dense: u32,
    sparse: u32,
    values: u32,
    reserved: u32,
}

/// Byte ranges of one vector's five slices.
struct SliceRanges {
    words: Range<usize>,
    ends: Range<usize>,
    dense_keys: Range<usize>,
    sparse_keys: Range<usize>,
    values: Range<usize>,
}

impl Entry {
    fn decode(words: &[u64; ENTRY_WORDS]) -> Entry {
        Entry {
            vid: words[0],
            offset: words[1],
            dense: words[2] as u32,
            sparse: (words[2] >> 32) as u32,
            values: words[3] as u32,
            reserved: (words[3] >> 32) as u32,
        }
    }

    fn encode(&self) -> [u64; ENTRY_WORDS] {
        [
            self.vid,
            self.offset,
            u64::from(self.dense) | u64::from(self.sparse) << 32,
            u64::from(self.values) | u64::from(self.reserved) << 32,
        ]
    }

    /// Where the slices lie, if they end at or before `limit`.
    fn slice_ranges(&self, limit: u64) -> Option<SliceRanges> {
        let mut at = self.offset;
        let mut next = |len: u64| -> Option<Range<usize>> {
            let end = at.checked_add(len)?;
            let range = usize::try_from(at).ok()?..usize::try_from(end).ok()?;
            at = end;
            Some(range)
        };
        let ranges = SliceRanges {
            words: next(u64::from(self.dense) * CONTAINER_WORDS as u64 * 8)?,
            ends: next(u64::from(self.sparse) * 4)?,
            dense_keys: next(u64::from(self.dense) * 2)?,
            sparse_keys: next(u64::from(self.sparse) * 2)?,
            values: next(u64::from(self.values) * 2)?,
        };
        (at <= limit).then_some(ranges)
    }
}
