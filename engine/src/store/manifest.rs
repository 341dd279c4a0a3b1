//! The manifest: the list of live segment files, replaced atomically.
//!
//! ```text
//! segment count u64 | (segment id u64, file length u64) × count, oldest first
//!   | store id u64 | epoch u64 | write u64 | piece u64 | footer
//! ```
//!
//! The order is the segments' age: where two segments hold records of one
//! vid, the later one's record is the newer. Version 1 listed ids ascending
//! (its segments only set bits, so their order did not matter); it is still
//! read. Since version 2 a merged segment takes the place of the run of
//! segments it replaces, so ids are distinct but need not ascend. Since
//! version 3 it also holds the store's [`Identity`]: the id made when the
//! store was created and the last write of a master it applied, so that a
//! wiped or restored directory is told from the one a master wrote to.
//!
//! Replacing it is the commit point of every change to a store: a new
//! manifest is written under a temporary name, synced and renamed over the
//! old one, so after a crash the directory holds the old list or the new one,
//! never a mix. The recorded lengths let opening refuse a segment that was
//! cut short before even reading it.

use super::StoreError;
use super::footer::{self, ChecksumWriter, Kind, u64_at};
use super::storage::Directory;

/// The manifest's file name.
pub(crate) const MANIFEST_NAME: &str = "MANIFEST";

const MANIFEST: Kind = Kind {
    magic: *b"BFOLDMAN",
    version: 3,
    name: "manifest",
};

/// The first version that holds the store's identity.
const IDENTITY_VERSION: u32 = 3;

/// The oldest manifest format version this build reads.
const OLDEST_VERSION: u32 = 1;

/// One live segment: its id (which gives its file name) and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentRecord {
    pub(crate) id: u64,
    pub(crate) len: u64,
}

/// The live segments, oldest first, and whose they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub(crate) segments: Vec<SegmentRecord>,
    /// `None` in a manifest older than version 3 (the store gets one when
    /// it is opened).
    pub(crate) identity: Option<Identity>,
}

/// Who a store is and how far the master's writes have reached it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Identity {
    /// Made at random when the store was created; a wiped directory, or
    /// another machine's, has another.
    pub store: u64,
    /// The newest master epoch whose write it has applied.
    pub epoch: u64,
    /// The last write it applied.
    pub applied: Stamp,
}

impl Identity {
    /// A new store's: a random id, nothing applied.
    pub(crate) fn new() -> Identity {
        use std::hash::{BuildHasher, Hasher};
        // `RandomState` is seeded from the operating system's randomness;
        // the time and process make two stores of one process differ too.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        hasher.write_u128(now);
        hasher.write_u32(std::process::id());
        Identity {
            // 0 is never an id: a request that names no store names none.
            store: hasher.finish().max(1),
            epoch: 0,
            applied: Stamp::default(),
        }
    }
}

/// A write's place in the master's order: its number, then the piece of it
/// (a large write travels in several). Later writes compare greater.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    /// The write's number, growing across the master's restarts.
    pub write: u64,
    /// The piece of the write, from 0.
    pub piece: u64,
}

impl Manifest {
    /// Reads and checks the manifest of `dir`.
    pub(crate) fn read(dir: &dyn Directory) -> Result<Manifest, StoreError> {
        let path = dir.path(MANIFEST_NAME);
        let bytes = dir.read(MANIFEST_NAME)?;
        let (body, version) = footer::check_versions(&bytes, &MANIFEST, OLDEST_VERSION, &path)?;
        let corrupt = |problem: String| StoreError::corrupt(&path, problem);
        if body.len() < 8 {
            return Err(corrupt("it has no segment count".into()));
        }
        let (body, identity) = if version >= IDENTITY_VERSION {
            let Some(split) = body.len().checked_sub(32).filter(|&s| s >= 8) else {
                return Err(corrupt("it has no store identity".into()));
            };
            let tail = &body[split..];
            let identity = Identity {
                store: u64_at(tail, 0),
                epoch: u64_at(tail, 8),
                applied: Stamp {
                    write: u64_at(tail, 16),
                    piece: u64_at(tail, 24),
                },
            };
            (&body[..split], Some(identity))
        } else {
            (body, None)
        };
        let count = u64_at(body, 0);
        if count.checked_mul(16) != Some(body.len() as u64 - 8) {
            return Err(corrupt(format!(
                "it declares {count} segments but holds {} bytes of them",
                body.len() - 8
            )));
        }
        let segments: Vec<SegmentRecord> = body[8..]
            .chunks_exact(16)
            .map(|record| SegmentRecord {
                id: u64_at(record, 0),
                len: u64_at(record, 8),
            })
            .collect();
        let mut ids: Vec<u64> = segments.iter().map(|record| record.id).collect();
        ids.sort_unstable();
        if let Some(pair) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(corrupt(format!("it names segment {} twice", pair[0])));
        }
        Ok(Manifest { segments, identity })
    }

    /// Replaces the manifest of `dir` with this one, durably.
    pub(crate) fn write(&self, dir: &dyn Directory) -> Result<(), StoreError> {
        let identity = self
            .identity
            .expect("a manifest is written with the store's identity");
        let mut out = ChecksumWriter::new(dir.create(MANIFEST_NAME)?);
        out.write(&(self.segments.len() as u64).to_le_bytes())?;
        for record in &self.segments {
            out.write(&record.id.to_le_bytes())?;
            out.write(&record.len.to_le_bytes())?;
        }
        for word in [
            identity.store,
            identity.epoch,
            identity.applied.write,
            identity.applied.piece,
        ] {
            out.write(&word.to_le_bytes())?;
        }
        out.finish(&MANIFEST)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::storage::MemoryDirectory;

    fn record(id: u64) -> SegmentRecord {
        SegmentRecord { id, len: 100 + id }
    }

    #[test]
    fn the_order_is_kept_and_a_repeated_id_refused() {
        let dir = MemoryDirectory::new();
        let aged = Manifest {
            segments: vec![record(9), record(2), record(5)],
            identity: Some(Identity {
                store: 77,
                epoch: 3,
                applied: Stamp {
                    write: 12,
                    piece: 1,
                },
            }),
        };
        aged.write(&dir).unwrap();
        assert_eq!(Manifest::read(&dir).unwrap(), aged);
        Manifest {
            segments: vec![record(3), record(4), record(3)],
            identity: Some(Identity::default()),
        }
        .write(&dir)
        .unwrap();
        let message = Manifest::read(&dir).unwrap_err().to_string();
        assert!(message.contains("it names segment 3 twice"), "{message}");
    }
}
