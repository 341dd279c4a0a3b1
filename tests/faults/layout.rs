//! How a seed's cluster places and cuts its vectors, so that the suite's
//! seeds cover both layouts with pieces: seed 1 (and 4, 7, ...) keeps
//! today's test layout, each vector one piece placed vid by vid; seed 2
//! cuts vectors into pieces of one container (`piece = 65536`) placed vid
//! by vid; seed 3 cuts them so and places piece `p` of every vector
//! together (`group = "all"`). Where vectors are cut, bit `b` of a run's
//! 64 is written at position `(b / 8) * 65536 + b % 8`: eight pieces of
//! eight bits each, every write and read touching several pieces.

use bitfold_server::pieces::Pieces;
use bitfold_server::placement::{GROUP_ALL, Placement};

/// Bits of a run that share a piece where vectors are cut.
const BITS_PER_PIECE: u32 = 8;

/// One seed's layout.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    cut: bool,
    all: bool,
}

impl Layout {
    /// The layout of `seed`'s run.
    pub fn of(seed: u64) -> Layout {
        Layout {
            cut: seed % 3 != 1,
            all: seed.is_multiple_of(3),
        }
    }

    /// The cluster file's lines for it.
    pub fn toml(&self) -> String {
        match (self.cut, self.all) {
            (false, _) => "group = 1\n".to_owned(),
            (true, false) => "group = 1\npiece = 65536\n".to_owned(),
            (true, true) => "group = \"all\"\npiece = 65536\n".to_owned(),
        }
    }

    /// How the cluster places keys.
    pub fn placement(&self, slaves: usize, replicas: usize) -> Placement {
        Placement {
            slaves,
            replicas,
            group: if self.all { GROUP_ALL } else { 1 },
            pieces: if self.cut {
                Pieces::new(1 << 16).expect("a valid piece")
            } else {
                Pieces::default()
            },
        }
    }

    /// Pieces a vector of the run may have.
    pub fn pieces(&self) -> u32 {
        if self.cut { 64 / BITS_PER_PIECE } else { 1 }
    }

    /// The bits of a run (below 64) that piece `piece` holds.
    pub fn piece_mask(&self, piece: u32) -> u64 {
        if self.cut {
            0xff << (piece * BITS_PER_PIECE)
        } else {
            u64::MAX
        }
    }

    /// Where bit `bit` (below 64) of a run is written.
    pub fn position(&self, bit: u32) -> u32 {
        if self.cut {
            ((bit / BITS_PER_PIECE) << 16) | (bit % BITS_PER_PIECE)
        } else {
            bit
        }
    }

    /// The bit of a run written at `position`, if any is.
    pub fn bit(&self, position: u32) -> Option<u32> {
        let bit = if self.cut {
            let (piece, low) = (position >> 16, position & 0xffff);
            (low < BITS_PER_PIECE).then_some(piece * BITS_PER_PIECE + low)?
        } else {
            position
        };
        (bit < 64).then_some(bit)
    }
}
