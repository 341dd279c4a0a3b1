//! Updates: clearing bits, deleting and replacing vectors
//! ([`Store::update`]).
//!
//! An update is read-modify-write under the store's write lock: the batch
//! is applied, in order, to the vectors as the current snapshot holds them,
//! and every vector it changed is written to one new segment as a `base`
//! record (the whole vector as of the update, possibly empty) or a
//! `deleted` one. Reads stay a union of parts read in place, newest first
//! until a `base` or `deleted` record; merges fold the older records away.
//!
//! A `base` or `deleted` record makes every older aggregate of its blocks
//! unusable: they may hold the bits it removed. [`Snapshot::cover`] then
//! reads those blocks through the levels below, down to single vectors only
//! around the changed vids, so it stays exact; a merge reaching the oldest
//! segment writes the blocks' aggregates afresh. What the update itself
//! writes depends on the batch:
//!
//! - Only deletes and replaces (what a move or a refill sends: whole
//!   vectors removed or copied): the changed records alone, with aggregates
//!   of the replaced vectors, and nothing else is read. A delete of a few
//!   vids costs a few index entries, not the data of their blocks.
//! - Any clear (a few bits off vectors that stay): so that a range over a
//!   block with pending clears is read about as after compaction, the
//!   segment also rebuilds the aggregates of every block of the widest
//!   level ([`AGGREGATE_LEVELS`]) it touched, at every level, from the
//!   vectors as they are after the update, and holds a `keep` record for
//!   each existing vector of those blocks it did not change. Its aggregates
//!   then stand for the older segments too ([`Snapshot::cover`] reads
//!   nothing older in a block it answered with one). The cost is paid by
//!   the update: it reads every vector of the blocks it touches (up to
//!   4,096 vids each). A later merge that takes the update segment in but
//!   not the oldest segment writes aggregates of its own records only; the
//!   blocks concerned are read through the lower levels again until a merge
//!   reaches the oldest segment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError};

use super::aggregate::{self, AGGREGATE_LEVELS};
use super::segment::{RecordKind, Segment, SegmentWriter};
use super::storage::Directory;
use super::{Fenced, Identity, Snapshot, Stamp, Store, StoreError, take_id};
use crate::fold::UnionPlan;
use crate::vector::{CONTAINER_WORDS, ContainerRef, VectorBuf, VectorPart};

/// One change to a vector (docs/protocol.md §8).
#[derive(Debug, Clone, Copy)]
pub enum Update<'a> {
    /// Removes these bits; the vector keeps existing (possibly empty).
    /// No-op if it does not exist.
    Clear(u64, VectorPart<'a>),
    /// Removes the vector (it no longer exists; ranges skip it). No-op if it
    /// does not exist.
    Delete(u64),
    /// Makes the vector exactly these bits, existing even if empty (a
    /// repair's copy).
    Replace(u64, VectorPart<'a>),
}

impl Update<'_> {
    /// The vid of the vector it changes.
    pub fn vid(&self) -> u64 {
        match *self {
            Update::Clear(vid, _) | Update::Delete(vid) | Update::Replace(vid, _) => vid,
        }
    }
}

/// What an update changed and wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// The vids whose vector changed, ascending: it lost a bit, was deleted,
    /// or was replaced by different bits (or created by a replace).
    pub changed: Vec<u64>,
    /// Bytes of the new segment file (0 if nothing changed).
    pub bytes: u64,
    /// Segments merged after the update (0 if no tier was full).
    pub merged_segments: usize,
}

impl Store {
    /// Applies the batch atomically, in batch order (a vid may appear more
    /// than once), serialised with imports: one new segment, all or
    /// nothing, durable (fsynced) when it returns Ok. A batch that changes
    /// nothing writes nothing.
    ///
    /// As with [`Store::import`], if only the merge that may follow fails,
    /// the update is still durable and the error says so
    /// ([`StoreError::Compaction`]).
    ///
    /// ```
    /// use bitfold_engine::{Store, Update, VectorBuf};
    ///
    /// let store = Store::in_memory();
    /// let bits = VectorBuf::from_bits(vec![1, 2, 3]);
    /// store.import(&[(7, bits.as_part()), (8, bits.as_part())]).unwrap();
    /// let two = VectorBuf::from_bits(vec![2]);
    /// let batch = [Update::Clear(7, two.as_part()), Update::Delete(8), Update::Delete(9)];
    /// assert_eq!(store.update(&batch).unwrap().changed, [7, 8]);
    /// let snapshot = store.snapshot();
    /// let seven: Vec<u32> = snapshot.parts(7).flat_map(|p| p.bits()).collect();
    /// assert_eq!(seven, [1, 3]);
    /// assert!(!snapshot.contains(8));
    /// ```
    ///
    /// A batch that only creates vectors (replaces, with bits, of vids that
    /// do not exist: a repair's or a move's copies onto a new owner) is
    /// written as an import: a `set` record of a vid that does not exist is
    /// the whole vector, so no aggregate needs rebuilding.
    pub fn update(&self, batch: &[Update<'_>]) -> Result<UpdateStats, StoreError> {
        let mut next_id = self.next_id.lock().unwrap_or_else(PoisonError::into_inner);
        let identity = self.identity();
        self.update_locked(&mut next_id, batch, identity)
    }

    /// [`Store::update`] as write `stamp` of a master of `epoch`, fenced
    /// as [`Store::import_at`] is.
    pub fn update_at(
        &self,
        epoch: u64,
        stamp: Stamp,
        batch: &[Update<'_>],
    ) -> Result<Fenced<UpdateStats>, StoreError> {
        let mut next_id = self.next_id.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(after) = self.fence(epoch, stamp) else {
            return Ok(self.refusal(epoch));
        };
        self.update_locked(&mut next_id, batch, after)
            .map(Fenced::Applied)
    }

    /// [`Store::update`], the caller holding the write lock (`next_id`);
    /// the manifest it installs records `after`.
    fn update_locked(
        &self,
        next_id: &mut u64,
        batch: &[Update<'_>],
        after: Identity,
    ) -> Result<UpdateStats, StoreError> {
        let snapshot = self.snapshot();
        if let Some(created) = only_creates(batch, &snapshot) {
            let stats = self.import_locked(next_id, &created, after)?;
            let mut changed: Vec<u64> = created.iter().map(|&(vid, _)| vid).collect();
            changed.sort_unstable();
            return Ok(UpdateStats {
                changed,
                bytes: stats.bytes,
                merged_segments: stats.merged_segments,
            });
        }
        let mut states: BTreeMap<u64, (Option<VectorBuf>, Option<VectorBuf>)> = BTreeMap::new();
        for update in batch {
            let (_, now) = states.entry(update.vid()).or_insert_with(|| {
                let before = current(&snapshot, update.vid());
                (before.clone(), before)
            });
            match *update {
                Update::Clear(_, bits) => {
                    if let Some(vector) = now {
                        *vector = difference(vector.as_part(), bits);
                    }
                }
                Update::Delete(_) => *now = None,
                Update::Replace(_, bits) => *now = Some(VectorBuf::from_part(bits)),
            }
        }
        let changed: BTreeMap<u64, Option<VectorBuf>> = states
            .into_iter()
            .filter(|(_, (before, after))| !same(before.as_ref(), after.as_ref()))
            .map(|(vid, (_, after))| (vid, after))
            .collect();
        if changed.is_empty() {
            self.record(after)?;
            return Ok(UpdateStats::default());
        }
        let id = take_id(next_id);
        let clears = batch.iter().any(|u| matches!(u, Update::Clear(..)));
        let bytes = if clears {
            write_update(&*self.dir, id, &snapshot, &changed)?
        } else {
            write_changes(&*self.dir, id, &changed)?
        };
        let mut segments = snapshot.segments.clone();
        segments.push(Arc::new(Segment::open(&*self.dir, id, bytes)?));
        self.install(segments, after)?;
        let merged_segments = self
            .merge_full_tiers(next_id)
            .map_err(|e| StoreError::Compaction(Box::new(e)))?;
        Ok(UpdateStats {
            changed: changed.into_keys().collect(),
            bytes,
            merged_segments,
        })
    }
}

/// The vectors `batch` creates, when that is all it does: every update a
/// replace with bits of a vid that does not exist, each vid once.
fn only_creates<'a>(
    batch: &[Update<'a>],
    snapshot: &Snapshot,
) -> Option<Vec<(u64, VectorPart<'a>)>> {
    let mut created = Vec::with_capacity(batch.len());
    for update in batch {
        match *update {
            Update::Replace(vid, bits) if !bits.is_empty() && !snapshot.contains(vid) => {
                created.push((vid, bits));
            }
            _ => return None,
        }
    }
    let mut vids: Vec<u64> = created.iter().map(|&(vid, _)| vid).collect();
    vids.sort_unstable();
    vids.dedup();
    (vids.len() == created.len()).then_some(created)
}

/// Writes update segment `id` holding only `changed`: a `base` record for
/// each vid with its vector after the update, a `deleted` record for each
/// vid deleted, and the aggregates of the `base` records' vectors (of this
/// segment alone). Returns the file's length.
fn write_changes(
    dir: &dyn Directory,
    id: u64,
    changed: &BTreeMap<u64, Option<VectorBuf>>,
) -> Result<u64, StoreError> {
    let mut writer = SegmentWriter::create(dir, id)?;
    let (mut vids, mut replaced) = (Vec::new(), Vec::new());
    for (&vid, after) in changed {
        match after {
            Some(vector) => {
                writer.add_record(vid, RecordKind::Base, &[vector.as_part()])?;
                vids.push(vid);
                replaced.push(vector.as_part());
            }
            None => writer.add_record(vid, RecordKind::Deleted, &[])?,
        }
    }
    aggregate::write(&mut writer, &vids, |range| replaced[range].iter().copied())?;
    writer.finish()
}

/// Writes update segment `id` for a batch with clears: a `base` or
/// `deleted` record for each vid of `changed` (its vector after the update, `None` if deleted), a `keep`
/// record for every other existing vector of the widest blocks those vids
/// fall in, and those blocks' aggregates as of after the update. Returns the
/// file's length.
fn write_update(
    dir: &dyn Directory,
    id: u64,
    snapshot: &Snapshot,
    changed: &BTreeMap<u64, Option<VectorBuf>>,
) -> Result<u64, StoreError> {
    let width = AGGREGATE_LEVELS[AGGREGATE_LEVELS.len() - 1];
    let mut writer = SegmentWriter::create(dir, id)?;
    writer.set_covers_older();
    let blocks: BTreeSet<u64> = changed.keys().map(|vid| vid - vid % width).collect();
    let mut existing = Vec::new();
    for first in blocks {
        let last = first + (width - 1);
        let mut vids: BTreeSet<u64> = snapshot
            .vids_from(first)
            .take_while(|&v| v <= last)
            .collect();
        vids.extend(changed.range(first..=last).map(|(&vid, _)| vid));
        for vid in vids {
            let (kind, parts) = match changed.get(&vid) {
                Some(None) => (RecordKind::Deleted, None),
                Some(Some(vector)) => (RecordKind::Base, Some(vector.as_part())),
                None => (RecordKind::Keep, None),
            };
            writer.add_record(vid, kind, parts.as_slice())?;
            if kind != RecordKind::Deleted {
                existing.push(vid);
            }
        }
    }
    aggregate::write(&mut writer, &existing, |range| {
        let mut parts = Vec::new();
        for &vid in &existing[range] {
            match changed.get(&vid) {
                Some(vector) => parts.extend(vector.as_ref().map(VectorBuf::as_part)),
                None => parts.extend(snapshot.parts(vid)),
            }
        }
        parts.into_iter()
    })?;
    writer.finish()
}

/// Vector `vid` as `snapshot` holds it, as one buffer; `None` if it does
/// not exist.
fn current(snapshot: &Snapshot, vid: u64) -> Option<VectorBuf> {
    if !snapshot.contains(vid) {
        return None;
    }
    let parts: Vec<VectorPart<'_>> = snapshot.parts(vid).collect();
    if let [only] = parts[..] {
        return Some(VectorBuf::from_part(only));
    }
    let mut vector = VectorBuf::new();
    for piece in UnionPlan::new(&parts).run(&parts) {
        for (key, container) in piece.as_part().containers() {
            push(&mut vector, key, container);
        }
    }
    Some(vector)
}

/// Appends `container` as it is.
fn push(vector: &mut VectorBuf, key: u16, container: ContainerRef<'_>) {
    let pushed = match container {
        ContainerRef::Dense(words) => vector.push_dense(key, words),
        ContainerRef::Sparse(values) => vector.push_sparse(key, values),
    };
    pushed.expect("containers are appended in ascending key order");
}

/// The bits of `vector` that are not in `minus`.
fn difference(vector: VectorPart<'_>, minus: VectorPart<'_>) -> VectorBuf {
    let mut out = VectorBuf::new();
    let mut words = [0u64; CONTAINER_WORDS];
    for (key, container) in vector.containers() {
        let Some(cleared) = minus.container(key) else {
            push(&mut out, key, container);
            continue;
        };
        let dense = match container {
            ContainerRef::Dense(dense) => dense,
            ContainerRef::Sparse(values) => {
                // Filtering the values costs less than expanding them.
                let kept: Vec<u16> = values
                    .iter()
                    .copied()
                    .filter(|&low| !cleared.contains(low))
                    .collect();
                out.push_positions(key, &kept)
                    .expect("containers are appended in ascending key order");
                continue;
            }
        };
        words.copy_from_slice(dense);
        match cleared {
            // Word by word: a clear of a dense container is 32,768 bits
            // on average, and a vector of 2^32 bits has 65,536 of them.
            ContainerRef::Dense(minus) => {
                for (word, minus) in words.iter_mut().zip(minus) {
                    *word &= !minus;
                }
            }
            ContainerRef::Sparse(values) => {
                for &low in values {
                    words[usize::from(low) / 64] &= !(1 << (low % 64));
                }
            }
        }
        out.push_words(key, &words)
            .expect("containers are appended in ascending key order");
    }
    out
}

/// Whether two states of a vector (`None`: it does not exist) are the same.
fn same(a: Option<&VectorBuf>, b: Option<&VectorBuf>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.as_part().cardinality() == b.as_part().cardinality()
                && difference(a.as_part(), b.as_part()).as_part().is_empty()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(vector: &VectorBuf) -> Vec<u32> {
        vector.as_part().bits().collect()
    }

    #[test]
    fn difference_removes_exactly_the_cleared_bits() {
        let dense: Vec<u32> = (0..5000).chain([70_000, 70_001]).collect();
        let vector = VectorBuf::from_bits(dense.clone());
        let minus = VectorBuf::from_bits((100..4900).chain([70_001, 1 << 20]).collect());
        let expected: Vec<u32> = (0..100).chain(4900..5000).chain([70_000]).collect();
        assert_eq!(
            bits(&difference(vector.as_part(), minus.as_part())),
            expected
        );
        let all = VectorBuf::from_bits(dense);
        assert!(
            difference(vector.as_part(), all.as_part())
                .as_part()
                .is_empty()
        );
    }

    proptest::proptest! {
        #[test]
        fn difference_is_the_set_difference(
            a in proptest::collection::btree_set(0u32..200_000, 0..12_000),
            b in proptest::collection::btree_set(0u32..200_000, 0..12_000),
            a_dense in 0u32..200_000,
            b_dense in 0u32..200_000,
        ) {
            // Runs of 6,000 bits make dense containers beside sparse ones.
            let a: std::collections::BTreeSet<u32> = a.into_iter().chain(a_dense..a_dense.saturating_add(6_000)).collect();
            let b: std::collections::BTreeSet<u32> = b.into_iter().chain(b_dense..b_dense.saturating_add(6_000)).collect();
            let got = difference(
                VectorBuf::from_bits(a.iter().copied().collect()).as_part(),
                VectorBuf::from_bits(b.iter().copied().collect()).as_part(),
            );
            let want: Vec<u32> = a.difference(&b).copied().collect();
            proptest::prop_assert_eq!(bits(&got), want);
        }
    }

    #[test]
    fn same_compares_bits_not_representation() {
        let sparse = VectorBuf::from_bits(vec![1, 2]);
        let mut dense = VectorBuf::new();
        let mut words = [0u64; CONTAINER_WORDS];
        words[0] = 0b110;
        dense.push_dense(0, &words).unwrap();
        assert!(same(Some(&sparse), Some(&dense)));
        assert!(!same(
            Some(&sparse),
            Some(&VectorBuf::from_bits(vec![1, 3]))
        ));
        assert!(!same(Some(&VectorBuf::new()), None));
        assert!(same(None, None));
    }
}
