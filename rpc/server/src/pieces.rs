//! Column pieces (docs/protocol.md §4): how a vector longer than `piece`
//! bits is cut, and the key each piece is stored and placed under.
//!
//! Piece `p` of a vector holds its bits `p * piece .. (p + 1) * piece`, at
//! their own positions (its containers keep their keys), so the pieces of
//! an answer are key-disjoint and join by concatenation. Everything below
//! the master's query and write interface (catalog, journal, owners,
//! copies, slaves' stores) deals in keys: piece `p` of vid `v` is key
//! `p * 2^48 + v`, so piece 0 of every vid is the vid itself and a
//! vector no longer than a piece is stored exactly as without pieces. The
//! vids of consecutive keys are consecutive within a piece, so a term's
//! vids are a run of keys in each piece.
//!
//! ```
//! use bitfold_server::pieces::Pieces;
//!
//! let pieces = Pieces::new(1 << 20).unwrap();
//! let key = pieces.key(7, 3);
//! assert_eq!(pieces.split(key), (7, 3));
//! assert_eq!(pieces.key(7, 0), 7);
//! assert_eq!(pieces.of_container(16), 1);
//! ```

use std::ops::RangeInclusive;

/// The bits of a key that name the vid; above them, the piece.
pub const VID_BITS: u32 = 48;

/// The largest vid a cluster that cuts vectors stores.
pub const MAX_CUT_VID: u64 = (1 << VID_BITS) - 1;

/// The piece width that never cuts a vector: a vector holds at most 2^32 bits.
pub const WHOLE: u64 = 1 << 32;

/// The default `piece`: 2^20 bits, the width of a Pilosa shard; see
/// docs/protocol.md §4 for how it was chosen.
pub const DEFAULT_PIECE: u64 = 1 << 20;

/// Bits per container of a vector (its key is its bits' top 16).
const CONTAINER_BITS: u32 = 16;

/// How a cluster cuts vectors: `piece` bits per piece, a power of two from
/// 2^16 (one container) to 2^32 ([`WHOLE`], no vector is cut).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pieces {
    /// log2 of the piece width minus 16: containers per piece, as a shift.
    shift: u32,
}

impl Default for Pieces {
    fn default() -> Self {
        Pieces::new(DEFAULT_PIECE).expect("the default piece is valid")
    }
}

impl Pieces {
    /// Pieces of `bits` bits; an error says which widths are allowed.
    pub fn new(bits: u64) -> Result<Pieces, String> {
        if !bits.is_power_of_two() || !(1 << CONTAINER_BITS..=WHOLE).contains(&bits) {
            return Err(format!(
                "piece = {bits}: it must be a power of two from 65536 (2^16) to 4294967296 \
                 (2^32, which never cuts a vector)"
            ));
        }
        Ok(Pieces {
            shift: bits.trailing_zeros() - CONTAINER_BITS,
        })
    }

    /// Vectors are never cut: every key is a vid.
    pub fn whole() -> Pieces {
        Pieces::new(WHOLE).expect("whole vectors are a valid piece")
    }

    /// Bits per piece.
    pub fn bits(&self) -> u64 {
        1 << (self.shift + CONTAINER_BITS)
    }

    /// Whether some vector may be cut: then vids are at most [`MAX_CUT_VID`].
    pub fn cuts(&self) -> bool {
        self.bits() < WHOLE
    }

    /// The largest vid this cluster stores.
    pub fn max_vid(&self) -> u64 {
        if self.cuts() { MAX_CUT_VID } else { u64::MAX }
    }

    /// How many pieces a vector of 2^32 bits has.
    pub fn count(&self) -> u32 {
        1 << (16 - self.shift)
    }

    /// The key of piece `piece` of `vid` (at most [`Pieces::max_vid`]).
    pub fn key(&self, vid: u64, piece: u32) -> u64 {
        debug_assert!(vid <= self.max_vid() && piece < self.count());
        (u64::from(piece) << VID_BITS) | vid
    }

    /// The vid and piece a key names.
    pub fn split(&self, key: u64) -> (u64, u32) {
        if self.cuts() {
            (key & MAX_CUT_VID, (key >> VID_BITS) as u32)
        } else {
            (key, 0)
        }
    }

    /// The vid a key names.
    pub fn vid(&self, key: u64) -> u64 {
        self.split(key).0
    }

    /// The piece holding container `key`.
    pub fn of_container(&self, key: u16) -> u32 {
        u32::from(key) >> self.shift
    }

    /// The container keys of piece `piece`.
    pub fn containers(&self, piece: u32) -> RangeInclusive<u16> {
        let first = piece << self.shift;
        let last = first + (1 << self.shift) - 1;
        first as u16..=last as u16
    }

    /// The keys of piece `piece` of the vids `first..=last`, or `None` when
    /// no stored vid lies there.
    pub fn keys(&self, piece: u32, first: u64, last: u64) -> Option<RangeInclusive<u64>> {
        let last = last.min(self.max_vid());
        (first <= last).then(|| self.key(first, piece)..=self.key(last, piece))
    }

    /// The pieces a vector's container keys `keys` fall in.
    pub fn spanned(&self, keys: RangeInclusive<u16>) -> RangeInclusive<u32> {
        self.of_container(*keys.start())..=self.of_container(*keys.end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_outside_the_containers_of_a_vector_are_refused() {
        for bits in [0, 1, 1 << 15, 3 << 20, 1 << 33] {
            assert!(Pieces::new(bits).is_err(), "{bits}");
        }
        assert_eq!(Pieces::new(1 << 16).unwrap().count(), 65_536);
        assert_eq!(Pieces::whole().count(), 1);
        assert!(!Pieces::whole().cuts());
    }

    #[test]
    fn keys_name_a_vid_and_a_piece_and_piece_zero_is_the_vid() {
        let pieces = Pieces::new(1 << 18).unwrap();
        for vid in [0, 1, 4_095, MAX_CUT_VID] {
            for piece in [0, 1, pieces.count() - 1] {
                assert_eq!(pieces.split(pieces.key(vid, piece)), (vid, piece));
            }
            assert_eq!(pieces.key(vid, 0), vid);
        }
        let whole = Pieces::whole();
        assert_eq!(whole.split(u64::MAX), (u64::MAX, 0));
        assert_eq!(whole.keys(0, 5, u64::MAX), Some(5..=u64::MAX));
    }

    #[test]
    fn a_piece_holds_consecutive_containers() {
        let pieces = Pieces::new(1 << 20).unwrap();
        assert_eq!(pieces.containers(0), 0..=15);
        assert_eq!(pieces.containers(4095), 65_520..=65_535);
        for key in [0u16, 15, 16, 65_535] {
            assert!(pieces.containers(pieces.of_container(key)).contains(&key));
        }
        assert_eq!(pieces.spanned(3..=40), 0..=2);
    }

    #[test]
    fn the_keys_of_a_term_stop_at_the_largest_vid_stored() {
        let pieces = Pieces::new(1 << 20).unwrap();
        assert_eq!(
            pieces.keys(2, 10, u64::MAX),
            Some(pieces.key(10, 2)..=pieces.key(MAX_CUT_VID, 2))
        );
        assert_eq!(pieces.keys(2, MAX_CUT_VID + 1, u64::MAX), None);
    }
}
