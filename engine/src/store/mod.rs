//! A slave's durable vector store: immutable segment files named by a
//! manifest, read through memory maps.
//!
//! Every import batch becomes one new segment file, written under a temporary
//! name, synced, renamed into place and the directory synced; then a new
//! manifest naming it replaces the old one the same way, and only then does
//! [`Store::import`] return `Ok`. A crash at any instant therefore leaves the
//! old manifest or the new one, each naming complete files; files the
//! manifest does not name are leftovers of an interrupted write, removed when
//! the store is next opened. Opening checks every live file's footer,
//! checksum and structure and refuses a damaged one with an error naming it.
//!
//! A vid may have a record in several segments. An import writes `set`
//! records (it never rewrites what is stored): the vector is the union of
//! its parts, which [`Snapshot::parts`] yields. [`Store::update`] clears
//! bits, deletes and replaces vectors by writing `base` records (the whole
//! vector as of the update) and `deleted` ones, through which reads of older
//! records stop; the manifest lists segments in age order so that "older"
//! is always known (see `update.rs`). So that the number of files (and
//! maps) stays small, segments are merged after an import or update:
//! segments fall in size tiers a factor of [`MERGE_FACTOR`] apart (the first
//! tier holding everything below 8 MiB), and when a tier holds
//! [`MERGE_FACTOR`] segments the shortest run of consecutive segments
//! holding them is merged into one (see `merge.rs`). A store of total size
//! `S` then has at most about `7 × log8(S / 1 MiB)` segments (under 50 for a
//! terabyte), and each byte is rewritten about once per tier rather than
//! once per import, as merging everything whenever there are 8 files would
//! do. A merge resolves each vid's records and streams the result window by
//! window, so even a vector of 2^32 bits (512 MiB dense) is never held
//! twice.
//!
//! Each segment also holds range aggregates: for aligned blocks of vids at
//! the widths of [`AGGREGATE_LEVELS`], the union of the vectors it holds in
//! the block. [`Snapshot::cover`] reads a run of vids as a few aggregates
//! and single parts instead of one part per vid and segment.
//!
//! Readers hold an `Arc<Snapshot>`: a merge swaps in a new snapshot and
//! deletes the old files, but a running query keeps the maps it has.
//!
//! The master's catalog lives on the same [`Directory`] contract, as a
//! [`VidLog`]: an append-only, checksummed list of vids added and removed.
//!
//! ```
//! use bitfold_engine::{Store, VectorBuf};
//!
//! let store = Store::in_memory();
//! let a = VectorBuf::from_bits(vec![1, 2, 3]);
//! let b = VectorBuf::from_bits(vec![3, 4]);
//! store.import(&[(7, a.as_part())]).unwrap();
//! store.import(&[(7, b.as_part())]).unwrap();
//! let snapshot = store.snapshot();
//! let bits: std::collections::BTreeSet<u32> =
//!     snapshot.parts(7).flat_map(|p| p.bits()).collect();
//! assert_eq!(bits.into_iter().collect::<Vec<_>>(), [1, 2, 3, 4]);
//! ```

mod aggregate;
mod background;
mod error;
mod footer;
mod log;
mod manifest;
mod merge;
mod mmap;
mod sealed;
mod segment;
mod snapshot;
mod storage;
mod update;

use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rayon::prelude::*;

pub use aggregate::{AGGREGATE_LEVELS, Cover, CoverStats};
pub use background::{BACKGROUND_NICE, spawn_background};
pub use error::StoreError;
pub use log::{VID_LOG_NAME, VidLog};
pub use sealed::{read_sealed, write_sealed};
pub use snapshot::Snapshot;
pub use storage::{AppendFile, Directory, FileBytes, FileWriter, MemoryDirectory, MmapDirectory};
pub use update::{Update, UpdateStats};

/// Makes the checksums of `bytes`, the whole of a store directory's file
/// `name`, match them: the records of the vid log ([`VID_LOG_NAME`]), the
/// footer of any other file. Magic numbers and versions are left as they
/// are. For the fuzz targets (cargo feature `fuzzing`), whose mutations
/// would otherwise nearly all stop at a checksum, before the checks of what
/// the file holds.
#[cfg(feature = "fuzzing")]
pub fn reseal(name: &str, bytes: &mut [u8]) {
    if name == VID_LOG_NAME {
        log::reseal(bytes);
    } else {
        footer::reseal(bytes);
    }
}

use crate::vector::VectorPart;
pub use manifest::{Identity, Stamp};
use manifest::{MANIFEST_NAME, Manifest, SegmentRecord};
use segment::{Segment, SegmentWriter, parse_segment_name, segment_name};

/// How many segments of one size tier are merged into one, and the size
/// ratio between tiers.
pub const MERGE_FACTOR: usize = 8;

/// What an import wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// Distinct vids in the batch with at least one bit.
    pub vectors: u64,
    /// Bytes of the new segment file (0 if the batch set no bit).
    pub bytes: u64,
    /// Segments merged after the import (0 if no tier was full).
    pub merged_segments: usize,
}

/// Where a master's write stands against what a store has applied
/// ([`Store::import_at`], [`Store::update_at`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced<T> {
    /// Applied now, durably, and recorded as the store's last write.
    Applied(T),
    /// Not applied: the store has applied this write or a later one (a
    /// write sent again, or one that arrives late).
    AlreadyApplied(Stamp),
    /// Not applied: a master of this later epoch has written since.
    OlderEpoch(u64),
}

/// An import batch written as a segment file that is not yet part of the
/// store ([`Store::stage`]).
#[derive(Debug)]
pub struct Staged {
    /// `None` for a batch that sets no bit.
    segment: Option<Arc<Segment>>,
    vectors: u64,
}

/// A slave's durable vector store. `Send + Sync`: imports are serialised,
/// snapshots can be taken from any thread at any time.
pub struct Store {
    dir: Arc<dyn Directory>,
    current: RwLock<Arc<Snapshot>>,
    /// The id the next segment file gets; held for the whole of a write.
    next_id: Mutex<u64>,
    /// Who it is and the last write it applied, as its manifest says.
    identity: RwLock<Identity>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).finish()
    }
}

impl Store {
    /// Opens (creating if missing) the store in `dir`, verifying every live
    /// file; a corrupt or truncated file is refused with an error naming it.
    /// The directory stays locked against other processes while the store lives.
    pub fn open(dir: impl AsRef<Path>) -> Result<Store, StoreError> {
        Store::with_directory(Arc::new(MmapDirectory::open(dir)?))
    }

    /// The same store held in memory (tests); nothing durable.
    pub fn in_memory() -> Store {
        Store::with_directory(Arc::new(MemoryDirectory::new()))
            .expect("an empty in-memory directory always opens")
    }

    /// Opens the store held in `dir` (creating an empty one if `dir` holds no
    /// store files), verifying every live file and removing the leftovers of
    /// interrupted writes: staged `.tmp` files and segment files the manifest
    /// does not name. Files of other names are left alone.
    pub fn with_directory(dir: Arc<dyn Directory>) -> Result<Store, StoreError> {
        let mut names = dir.list()?;
        if !names.iter().any(|name| name == MANIFEST_NAME) {
            if let Some(segment) = names.iter().find(|name| parse_segment_name(name).is_some()) {
                return Err(StoreError::Missing {
                    path: dir.path(MANIFEST_NAME),
                    reason: format!("the directory holds segment files such as {segment}"),
                });
            }
            let manifest = Manifest {
                segments: Vec::new(),
                identity: Some(Identity::new()),
            };
            manifest.write(&*dir)?;
            // Writing it staged the manifest over any `MANIFEST.tmp` left by
            // a first open cut short, and renamed it: list again.
            names = dir.list()?;
        }
        let mut manifest = Manifest::read(&*dir)?;
        if manifest.identity.is_none() {
            // A store written before stores had identities: it gets one now,
            // durably, so that it keeps it.
            manifest.identity = Some(Identity::new());
            manifest.write(&*dir)?;
        }
        let identity = manifest.identity.unwrap_or_default();
        let segments = manifest
            .segments
            .par_iter()
            .map(|record| Segment::open(&*dir, record.id, record.len).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        for name in names.iter().filter(|name| is_leftover(name, &manifest)) {
            dir.delete(name)?;
        }
        let next_id = manifest
            .segments
            .iter()
            .map(|r| r.id + 1)
            .max()
            .unwrap_or(1);
        Ok(Store {
            dir,
            current: RwLock::new(Arc::new(Snapshot::new(segments))),
            next_id: Mutex::new(next_id),
            identity: RwLock::new(identity),
        })
    }

    /// Who the store is and the last master write it applied.
    pub fn identity(&self) -> Identity {
        *self.identity.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Store::import`] as write `stamp` of a master of `epoch`, fenced:
    /// applied only if it is later than every write the store has applied
    /// and no later epoch has written; then recorded, in the same manifest
    /// as the batch, as the store's last write (even if it sets no bit).
    pub fn import_at(
        &self,
        epoch: u64,
        stamp: Stamp,
        batch: &[(u64, VectorPart<'_>)],
    ) -> Result<Fenced<ImportStats>, StoreError> {
        let mut next_id = self.next_id.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(after) = self.fence(epoch, stamp) else {
            return Ok(self.refusal(epoch));
        };
        self.import_locked(&mut next_id, batch, after)
            .map(Fenced::Applied)
    }

    /// The identity the store has once it applies write `stamp` of a master
    /// of `epoch`, or `None` if the fence refuses it.
    fn fence(&self, epoch: u64, stamp: Stamp) -> Option<Identity> {
        let now = self.identity();
        (epoch >= now.epoch && stamp > now.applied).then_some(Identity {
            store: now.store,
            epoch,
            applied: stamp,
        })
    }

    /// Why the fence refused a write of a master of `epoch`.
    fn refusal<T>(&self, epoch: u64) -> Fenced<T> {
        let now = self.identity();
        if epoch < now.epoch {
            Fenced::OlderEpoch(now.epoch)
        } else {
            Fenced::AlreadyApplied(now.applied)
        }
    }

    /// Sets the bits of every (vid, vector) (union with what is held); vids
    /// may repeat; empty vectors create nothing. Durable (fsynced) when it
    /// returns Ok.
    ///
    /// The batch becomes one new segment; a merge of full size tiers may
    /// follow. If only that merge fails the batch is still durable, and the
    /// error says so ([`StoreError::Compaction`]).
    pub fn import(&self, batch: &[(u64, VectorPart<'_>)]) -> Result<ImportStats, StoreError> {
        let mut next_id = self.next_id.lock().unwrap_or_else(PoisonError::into_inner);
        let identity = self.identity();
        self.import_locked(&mut next_id, batch, identity)
    }

    /// [`Store::import`], the caller holding the write lock (`next_id`);
    /// the manifest it installs records `after`.
    fn import_locked(
        &self,
        next_id: &mut u64,
        batch: &[(u64, VectorPart<'_>)],
        after: Identity,
    ) -> Result<ImportStats, StoreError> {
        let staged = self.write_staged(batch, || take_id(next_id))?;
        self.install_staged(next_id, vec![staged], after)
    }

    /// Writes the batch of [`Store::import`] as a segment file, durably,
    /// without making it part of the store: [`Store::commit_at`] does, or
    /// [`Store::discard`] removes it (a store opened again removes it too).
    /// Stages may be written while other writes run; only the commit waits
    /// for them.
    pub fn stage(&self, batch: &[(u64, VectorPart<'_>)]) -> Result<Staged, StoreError> {
        self.write_staged(batch, || {
            take_id(&mut self.next_id.lock().unwrap_or_else(PoisonError::into_inner))
        })
    }

    /// Makes every batch of `staged` part of the store at once (one
    /// manifest), as write `stamp` of a master of `epoch`, fenced as
    /// [`Store::import_at`] is; refused ones are removed.
    pub fn commit_at(
        &self,
        epoch: u64,
        stamp: Stamp,
        staged: Vec<Staged>,
    ) -> Result<Fenced<ImportStats>, StoreError> {
        let mut next_id = self.next_id.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(after) = self.fence(epoch, stamp) else {
            staged.into_iter().for_each(|s| self.discard(s));
            return Ok(self.refusal(epoch));
        };
        self.install_staged(&mut next_id, staged, after)
            .map(Fenced::Applied)
    }

    /// Removes a staged batch that will not be committed.
    pub fn discard(&self, staged: Staged) {
        if let Some(segment) = staged.segment {
            // A file left behind is removed when the store is next opened.
            let _ = self.dir.delete(&segment_name(segment.id()));
        }
    }

    /// Installs every batch of `staged` (the caller holding the write lock,
    /// `next_id`), recording `after` in the manifest, then merges full tiers.
    fn install_staged(
        &self,
        next_id: &mut u64,
        staged: Vec<Staged>,
        after: Identity,
    ) -> Result<ImportStats, StoreError> {
        let vectors = staged.iter().map(|s| s.vectors).sum();
        let new: Vec<Arc<Segment>> = staged.into_iter().filter_map(|s| s.segment).collect();
        if new.is_empty() {
            self.record(after)?;
            return Ok(ImportStats::default());
        }
        let bytes = new.iter().map(|s| s.len()).sum();
        let mut segments = self.snapshot().segments.clone();
        segments.extend(new);
        self.install(segments, after)?;
        let merged_segments = self
            .merge_full_tiers(next_id)
            .map_err(|e| StoreError::Compaction(Box::new(e)))?;
        Ok(ImportStats {
            vectors,
            bytes,
            merged_segments,
        })
    }

    /// Writes the batch as a new segment file, its id from `new_id`.
    fn write_staged(
        &self,
        batch: &[(u64, VectorPart<'_>)],
        new_id: impl FnOnce() -> u64,
    ) -> Result<Staged, StoreError> {
        let mut order: Vec<usize> = (0..batch.len())
            .filter(|&i| !batch[i].1.is_empty())
            .collect();
        if order.is_empty() {
            return Ok(Staged {
                segment: None,
                vectors: 0,
            });
        }
        order.sort_by_key(|&i| batch[i].0);
        let id = new_id();
        let mut writer = SegmentWriter::create(&*self.dir, id)?;
        let mut group = Vec::new();
        let (mut vids, mut ends) = (Vec::new(), Vec::new());
        for same_vid in order.chunk_by(|&a, &b| batch[a].0 == batch[b].0) {
            group.clear();
            group.extend(same_vid.iter().map(|&i| batch[i].1));
            writer.add(batch[same_vid[0]].0, &group)?;
            vids.push(batch[same_vid[0]].0);
            ends.push(ends.last().unwrap_or(&0) + same_vid.len());
        }
        aggregate::write(&mut writer, &vids, |range| {
            let parts = ends_range(&ends, range);
            order[parts].iter().map(|&i| batch[i].1)
        })?;
        let vectors = writer.vector_count();
        let bytes = writer.finish()?;
        let segment = Arc::new(Segment::open(&*self.dir, id, bytes)?);
        Ok(Staged {
            segment: Some(segment),
            vectors,
        })
    }

    /// A consistent immutable view, valid while held (maps stay alive).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Makes `segments` (oldest first) the live set and `identity` the
    /// store's: the manifest first, then what readers see.
    fn install(&self, segments: Vec<Arc<Segment>>, identity: Identity) -> Result<(), StoreError> {
        let manifest = Manifest {
            segments: segments
                .iter()
                .map(|s| SegmentRecord {
                    id: s.id(),
                    len: s.len(),
                })
                .collect(),
            identity: Some(identity),
        };
        manifest.write(&*self.dir)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Snapshot::new(segments));
        *self
            .identity
            .write()
            .unwrap_or_else(PoisonError::into_inner) = identity;
        Ok(())
    }

    /// Records `identity` (a write that changed no vector) unless it is the
    /// store's already; the caller holds the write lock.
    fn record(&self, identity: Identity) -> Result<(), StoreError> {
        if identity == self.identity() {
            return Ok(());
        }
        self.install(self.snapshot().segments.clone(), identity)
    }

    /// Merges runs of consecutive segments until no size tier is full;
    /// returns how many segments were merged.
    fn merge_full_tiers(&self, next_id: &mut u64) -> Result<usize, StoreError> {
        let mut merged = 0;
        loop {
            let snapshot = self.snapshot();
            let Some(run) = merge::full_run(&snapshot.segments) else {
                return Ok(merged);
            };
            let group = &snapshot.segments[run.clone()];
            let id = take_id(next_id);
            let len = merge::write(&*self.dir, id, group, run.start == 0)?;
            let mut segments = snapshot.segments.clone();
            segments.splice(run, [Arc::new(Segment::open(&*self.dir, id, len)?)]);
            self.install(segments, self.identity())?;
            for old in group {
                // Snapshots still holding the old segment keep its map. A
                // failed delete only leaves a file the manifest no longer
                // names, which the next open removes.
                let _ = self.dir.delete(&segment_name(old.id()));
            }
            merged += group.len();
        }
    }
}

/// The range of items of the groups `groups`, where group `g` ends at item
/// `ends[g]`.
fn ends_range(ends: &[usize], groups: Range<usize>) -> Range<usize> {
    let start = groups.start.checked_sub(1).map_or(0, |g| ends[g]);
    start..ends[groups.end - 1]
}

fn take_id(next_id: &mut u64) -> u64 {
    let id = *next_id;
    *next_id += 1;
    id
}

/// Whether `name` is the leftover of an interrupted write: a staged file, or
/// a segment the manifest does not name.
fn is_leftover(name: &str, manifest: &Manifest) -> bool {
    if let Some(staged) = name.strip_suffix(".tmp") {
        return staged == MANIFEST_NAME || parse_segment_name(staged).is_some();
    }
    parse_segment_name(name).is_some_and(|id| manifest.segments.iter().all(|r| r.id != id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_of_interrupted_writes_are_leftovers() {
        let manifest = Manifest {
            segments: vec![SegmentRecord { id: 3, len: 100 }],
            identity: None,
        };
        assert!(!is_leftover(MANIFEST_NAME, &manifest));
        assert!(!is_leftover(&segment_name(3), &manifest));
        assert!(is_leftover(&segment_name(4), &manifest));
        assert!(is_leftover(&format!("{}.tmp", segment_name(3)), &manifest));
        assert!(is_leftover("MANIFEST.tmp", &manifest));
        for other in ["LOCK", "notes.txt", "seg-3.bfseg", "x.tmp"] {
            assert!(!is_leftover(other, &manifest), "{other}");
        }
    }
}
