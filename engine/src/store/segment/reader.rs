//! Opening a segment file: [`Segment`] verifies the footer, the checksum,
//! both indexes and every vector once, then hands out [`VectorPart`]s read
//! in place.

use std::io;
use std::ops::Range;
use std::path::PathBuf;

use super::{
    COVERS_OLDER, DENSE_ALIGN, ENTRY_WORDS, Entry, OLDEST_VERSION, RecordKind, SEGMENT,
    segment_name, trailer_len,
};
use crate::runs::VidRun;
use crate::store::StoreError;
use crate::store::aggregate;
use crate::store::footer::{self, u64_at};
use crate::store::storage::{Directory, FileBytes};
use crate::vector::VectorPart;

/// An open, verified segment file.
pub(crate) struct Segment {
    id: u64,
    path: PathBuf,
    bytes: FileBytes,
    /// Byte range of the vector index.
    index: Range<usize>,
    /// Byte range of the aggregate index (right after the vector index).
    aggregates: Range<usize>,
    /// Whether the aggregates cover older segments too ([`COVERS_OLDER`]).
    covers_older: bool,
    /// What to add to an aggregate entry's level for its index in
    /// [`aggregate::AGGREGATE_LEVELS`]: nonzero for formats before the
    /// lowest level existed.
    level_shift: u32,
    /// Records whose vector exists as of this segment (all but `deleted`).
    existing: usize,
    /// Records that end their vid's chain (`base` and `deleted`).
    chain_ends: usize,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} bytes)", self.path.display(), self.bytes.len())
    }
}

impl Segment {
    /// Opens segment `id`, which the manifest says is `expected_len` bytes,
    /// and verifies its footer, checksum, index and every vector.
    pub(crate) fn open(
        dir: &dyn Directory,
        id: u64,
        expected_len: u64,
    ) -> Result<Segment, StoreError> {
        let name = segment_name(id);
        let path = dir.path(&name);
        let bytes = match dir.read(&name) {
            Err(StoreError::Io { cause, .. }) if cause.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::Missing {
                    path,
                    reason: "the manifest names it as holding vectors".into(),
                });
            }
            other => other?,
        };
        if bytes.len() as u64 != expected_len {
            return Err(StoreError::corrupt(
                path,
                format!(
                    "it is {} bytes long, but the manifest recorded {expected_len}: \
                     the file is truncated or was replaced",
                    bytes.len()
                ),
            ));
        }
        let (body, version) = footer::check_versions(&bytes, &SEGMENT, OLDEST_VERSION, &path)?;
        let trailer_len = trailer_len(version);
        let corrupt = |problem: String| StoreError::corrupt(&path, problem);
        let data_end = body
            .len()
            .checked_sub(trailer_len)
            .ok_or_else(|| corrupt("it has no room for its trailer".into()))?;
        let index_offset = u64_at(&bytes, data_end);
        let count = u64_at(&bytes, data_end + 8);
        let aggregate_count = if version == 1 {
            0
        } else {
            u64_at(&bytes, data_end + 16)
        };
        let flags = if version >= 3 {
            u64_at(&bytes, data_end + 24)
        } else {
            0
        };
        if flags & !COVERS_OLDER != 0 {
            return Err(corrupt(format!("its trailer has unknown flags {flags:#x}")));
        }
        let entry_bytes = (ENTRY_WORDS * 8) as u64;
        let index_end = count
            .checked_mul(entry_bytes)
            .and_then(|len| index_offset.checked_add(len));
        let aggregates_end = index_end
            .zip(aggregate_count.checked_mul(entry_bytes))
            .and_then(|(end, len)| end.checked_add(len));
        let index_end = match index_end {
            Some(end)
                if index_offset.is_multiple_of(8) && aggregates_end == Some(data_end as u64) =>
            {
                end
            }
            _ => {
                return Err(corrupt(format!(
                    "its trailer puts {count} index entries and {aggregate_count} aggregate \
                     entries at byte {index_offset}, which do not fit before byte {data_end}"
                )));
            }
        };
        let index = index_offset as usize..index_end as usize;
        let aggregates = index_end as usize..data_end;
        if bytemuck::try_cast_slice::<u8, u64>(&bytes[index.start..data_end]).is_err() {
            return Err(corrupt("its index is not 8-byte aligned in memory".into()));
        }
        let mut segment = Segment {
            id,
            path,
            bytes,
            index,
            aggregates,
            covers_older: flags & COVERS_OLDER != 0,
            level_shift: if version < 4 {
                aggregate::OLD_LEVEL_SHIFT
            } else {
                0
            },
            existing: 0,
            chain_ends: 0,
        };
        segment.verify_entries(
            segment.entries(),
            "index entry",
            |entry| entry.vid,
            |entry| record_problem(version, entry),
        )?;
        let level_shift = segment.level_shift;
        segment.verify_entries(
            segment.aggregate_entries(),
            "aggregate entry",
            |entry| (u64::from(entry.reserved), entry.vid),
            |entry| {
                aggregate::block_problem(entry.reserved.saturating_add(level_shift), entry.vid)
                    .or_else(|| no_containers(entry).then(|| "it has no containers".to_owned()))
            },
        )?;
        let kinds = (0..segment.vector_count()).map(|i| segment.kind_at(i));
        let (existing, chain_ends) = kinds.fold((0, 0), |(existing, ends), kind| {
            (
                existing + usize::from(kind != RecordKind::Deleted),
                ends + usize::from(kind.ends_chain()),
            )
        });
        segment.existing = existing;
        segment.chain_ends = chain_ends;
        Ok(segment)
    }

    /// Checks the order, alignment, bounds and part invariants of `entries`
    /// (the vector index or the aggregate index: `what` names an entry), and
    /// what `problem` says of each. Entries ascend strictly by `key`: the
    /// vid in the vector index, (level, block) in the aggregate index.
    fn verify_entries<K: Ord>(
        &self,
        entries: &[[u64; ENTRY_WORDS]],
        what: &str,
        key: impl Fn(&Entry) -> K,
        problem: impl Fn(&Entry) -> Option<String>,
    ) -> Result<(), StoreError> {
        let mut last: Option<K> = None;
        for (i, words) in entries.iter().enumerate() {
            let entry = Entry::decode(words);
            let key = key(&entry);
            let problem = if last.as_ref().is_some_and(|l| *l >= key) {
                Some("vids are not strictly ascending".to_owned())
            } else if let Some(problem) = problem(&entry) {
                Some(problem)
            } else if entry.dense > 0 && !entry.offset.is_multiple_of(DENSE_ALIGN) {
                Some(format!(
                    "dense words at byte {} are not aligned",
                    entry.offset
                ))
            } else {
                match self.slices(&entry, VectorPart::new) {
                    Ok(Ok(_)) => None,
                    Ok(Err(malformed)) => Some(malformed.to_string()),
                    Err(problem) => Some(problem),
                }
            };
            if let Some(problem) = problem {
                return Err(StoreError::corrupt(
                    &self.path,
                    format!("{what} {i} (vid {}): {problem}", entry.vid),
                ));
            }
            last = Some(key);
        }
        Ok(())
    }

    /// Casts the five slices of `entry`'s vector out of the file, bounds and
    /// alignment checked, and hands them to `build` (`VectorPart::new` to
    /// check the part invariants too, `VectorPart::from_verified` once checked).
    fn slices<'s, R>(
        &'s self,
        entry: &Entry,
        build: impl FnOnce(&'s [u16], &'s [u64], &'s [u16], &'s [u32], &'s [u16]) -> R,
    ) -> Result<R, String> {
        let ranges = entry
            .slice_ranges(self.index.start as u64)
            .ok_or_else(|| format!("its data at byte {} runs past the data", entry.offset))?;
        let bytes = &self.bytes[..];
        fn cast<'a, T: bytemuck::AnyBitPattern>(
            bytes: &'a [u8],
            range: Range<usize>,
            what: &str,
        ) -> Result<&'a [T], String> {
            if range.is_empty() {
                // bytemuck refuses even an empty slice at an unaligned address.
                return Ok(&[]);
            }
            bytemuck::try_cast_slice(&bytes[range])
                .map_err(|_| format!("its {what} are misaligned"))
        }
        Ok(build(
            cast(bytes, ranges.dense_keys, "dense keys")?,
            cast(bytes, ranges.words, "dense words")?,
            cast(bytes, ranges.sparse_keys, "sparse keys")?,
            cast(bytes, ranges.ends, "sparse ends")?,
            cast(bytes, ranges.values, "sparse values")?,
        ))
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Bytes of the file.
    pub(crate) fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    #[inline]
    fn entries(&self) -> &[[u64; ENTRY_WORDS]] {
        let words: &[u64] = bytemuck::cast_slice(&self.bytes[self.index.clone()]);
        words.as_chunks().0
    }

    fn aggregate_entries(&self) -> &[[u64; ENTRY_WORDS]] {
        let words: &[u64] = bytemuck::cast_slice(&self.bytes[self.aggregates.clone()]);
        words.as_chunks().0
    }

    fn entry(&self, i: usize) -> Entry {
        Entry::decode(&self.entries()[i])
    }

    /// Whether each aggregate covers every vector existing in its block as
    /// of this segment (a segment written by an update), not only the
    /// segment's own records.
    pub(crate) fn covers_older(&self) -> bool {
        self.covers_older
    }

    /// Records whose vector exists as of this segment (all but `deleted`).
    pub(crate) fn existing_count(&self) -> usize {
        self.existing
    }

    /// Whether some record is `deleted`.
    pub(crate) fn has_deletes(&self) -> bool {
        self.existing < self.vector_count()
    }

    /// Whether some record ends its vid's chain (`base` or `deleted`).
    pub(crate) fn ends_chains(&self) -> bool {
        self.chain_ends > 0
    }

    /// The kind of the `i`-th record.
    #[inline]
    pub(crate) fn kind_at(&self, i: usize) -> RecordKind {
        RecordKind::from_field((self.entries()[i][3] >> 32) as u32)
            .expect("every record kind was verified when the segment was opened")
    }

    /// Whether this segment has range aggregates (version 1 segments and
    /// segments holding no two vids in one block have none).
    pub(crate) fn has_aggregates(&self) -> bool {
        !self.aggregates.is_empty()
    }

    /// The aggregate of the block of level `level` starting at vid `block`:
    /// the union of this segment's vectors in that block, if it has one.
    pub(crate) fn aggregate(&self, level: usize, block: u64) -> Option<VectorPart<'_>> {
        let entries = self.aggregate_entries();
        let stored = (level as u64).checked_sub(u64::from(self.level_shift))?;
        let key = (stored, block);
        let i = entries
            .binary_search_by_key(&key, |entry| (entry[3] >> 32, entry[0]))
            .ok()?;
        let part = self.slices(&Entry::decode(&entries[i]), VectorPart::from_verified);
        Some(part.expect("every aggregate was verified when the segment was opened"))
    }

    /// The first entry among `within` whose vid is `first` or more
    /// (`within.end` when there is none).
    pub(crate) fn first_entry_from(&self, within: Range<usize>, first: u64) -> usize {
        within.start + self.entries()[within].partition_point(|entry| entry[0] < first)
    }

    /// The entries among `within` whose vids lie in `first..=last`: a
    /// binary search for the first, then a galloping one for the end, which
    /// stays near the first (a range asked for is short next to a segment).
    pub(crate) fn entries_between(
        &self,
        within: Range<usize>,
        first: u64,
        last: u64,
    ) -> Range<usize> {
        let start = self.first_entry_from(within.clone(), first);
        let rest = &self.entries()[start..within.end];
        start..start + leading(rest.len(), |k| rest[k][0] <= last)
    }

    /// The entries among `within` whose vids lie in `first..=last`, as
    /// stretches of consecutive vids, ascending: each the entries and the
    /// run of vids they hold. Costs a galloping search per stretch, not a
    /// step per entry.
    pub(crate) fn stretches(
        &self,
        within: Range<usize>,
        first: u64,
        last: u64,
    ) -> impl Iterator<Item = (Range<usize>, VidRun)> + '_ {
        let found = self.entries_between(within, first, last);
        let entries = self.entries();
        let mut at = found.start;
        std::iter::from_fn(move || {
            if at >= found.end {
                return None;
            }
            let start = at;
            let vid = entries[start][0];
            let len = consecutive(&entries[start..found.end], vid);
            at = start + len;
            let run = VidRun {
                first: vid,
                last: vid + (len as u64 - 1),
            };
            Some((start..at, run))
        })
    }

    pub(crate) fn vector_count(&self) -> usize {
        self.entries().len()
    }

    /// The vid of the `i`-th vector.
    #[inline]
    pub(crate) fn vid_at(&self, i: usize) -> u64 {
        self.entries()[i][0]
    }

    /// The `i`-th vector.
    pub(crate) fn part_at(&self, i: usize) -> VectorPart<'_> {
        // The slice ranges were checked when the segment was opened, and
        // the bytes have not changed since; this only rebuilds the view.
        self.slices(&self.entry(i), VectorPart::from_verified)
            .expect("every vector was verified when the segment was opened")
    }

    fn find(&self, vid: u64) -> Option<usize> {
        self.entries()
            .binary_search_by_key(&vid, |entry| entry[0])
            .ok()
    }

    /// The kind of the record of vector `vid`, if this segment holds one.
    pub(crate) fn kind(&self, vid: u64) -> Option<RecordKind> {
        Some(self.kind_at(self.find(vid)?))
    }

    /// The record of vector `vid`, if this segment holds one: its kind and part.
    pub(crate) fn record(&self, vid: u64) -> Option<(RecordKind, VectorPart<'_>)> {
        let i = self.find(vid)?;
        Some((self.kind_at(i), self.part_at(i)))
    }
}

/// How many of `entries` (ascending, the first holding `vid`) hold `vid`,
/// `vid + 1`, ... with none skipped: entry `k` holds `vid + k` exactly for
/// a prefix of them.
fn consecutive(entries: &[[u64; ENTRY_WORDS]], vid: u64) -> usize {
    leading(entries.len(), |k| entries[k][0] - vid == k as u64)
}

/// How many of `0..len` lead with `holds` true, where `holds` is true for
/// a prefix and false after it: a galloping search (1, 2, 4, ... then a
/// binary search), whose probes stay near 0 when the prefix is short.
fn leading(len: usize, holds: impl Fn(usize) -> bool) -> usize {
    let mut bound = 1;
    while bound <= len && holds(bound - 1) {
        bound *= 2;
    }
    // `holds` is true below `bound / 2`; false at `bound - 1` or past the end.
    let (mut lo, mut hi) = (bound / 2, (bound - 1).min(len));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

fn no_containers(entry: &Entry) -> bool {
    entry.dense == 0 && entry.sparse == 0
}

/// What is wrong with the kind of a record of a segment of format
/// `version`, or with its number of containers for that kind, if anything.
fn record_problem(version: u32, entry: &Entry) -> Option<String> {
    let kind = match RecordKind::from_field(entry.reserved) {
        Some(kind) if version >= 3 || kind == RecordKind::Set => kind,
        _ => return Some(format!("record kind {} is unknown", entry.reserved)),
    };
    match kind {
        RecordKind::Set if no_containers(entry) => Some("the vector has no containers".to_owned()),
        RecordKind::Deleted | RecordKind::Keep if !no_containers(entry) => {
            Some(format!("a {kind:?} record holds containers"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VectorBuf;
    use crate::store::footer::reseal;
    use crate::store::segment::SegmentWriter;
    use crate::store::storage::MemoryDirectory;

    /// A segment with a dense-and-sparse vector 3 and a sparse vector 9.
    fn sample(dir: &MemoryDirectory) -> (Vec<u8>, VectorBuf, VectorBuf) {
        let a = VectorBuf::from_bits((0..3000).chain([1 << 20, u32::MAX]).collect());
        let b = VectorBuf::from_bits(vec![5, 6, 1 << 31]);
        let mut writer = SegmentWriter::create(dir, 1).unwrap();
        writer.add(3, &[a.as_part()]).unwrap();
        writer.add(9, &[b.as_part()]).unwrap();
        writer.finish().unwrap();
        (dir.read(&segment_name(1)).unwrap().to_vec(), a, b)
    }

    fn replace(dir: &MemoryDirectory, bytes: &[u8]) {
        let mut file = dir.create(&segment_name(1)).unwrap();
        file.write_all(bytes).unwrap();
        file.commit().unwrap();
    }

    fn refusal(dir: &MemoryDirectory, bytes: &[u8]) -> String {
        replace(dir, bytes);
        let err = Segment::open(dir, 1, bytes.len() as u64).expect_err("accepted");
        let message = err.to_string();
        assert!(message.contains(&segment_name(1)), "{message}");
        message
    }

    #[test]
    fn parts_read_back_from_their_alignment() {
        let dir = MemoryDirectory::new();
        let (bytes, a, b) = sample(&dir);
        let segment = Segment::open(&dir, 1, bytes.len() as u64).unwrap();
        assert_eq!(segment.record(3).map(|(_, part)| part), Some(a.as_part()));
        assert_eq!(segment.record(9).map(|(_, part)| part), Some(b.as_part()));
        assert_eq!(segment.record(4).map(|(_, part)| part), None);
        let words = segment
            .record(3)
            .map(|(_, part)| part)
            .unwrap()
            .dense_words();
        assert_eq!(words.as_ptr() as usize % DENSE_ALIGN as usize, 0);
    }

    #[test]
    fn every_cut_is_refused_by_the_footer() {
        let dir = MemoryDirectory::new();
        let (bytes, _, _) = sample(&dir);
        for len in 0..bytes.len() {
            refusal(&dir, &bytes[..len]);
        }
    }

    #[test]
    fn a_resealed_bad_aggregate_entry_is_refused() {
        let dir = MemoryDirectory::new();
        let (a, b) = (VectorBuf::from_bits(vec![1]), VectorBuf::from_bits(vec![2]));
        let mut writer = SegmentWriter::create(&dir, 1).unwrap();
        writer.add(32, &[a.as_part()]).unwrap();
        writer.add(33, &[b.as_part()]).unwrap();
        writer
            .add_aggregate(0, 32, &[a.as_part(), b.as_part()])
            .unwrap();
        writer.finish().unwrap();
        let bytes = dir.read(&segment_name(1)).unwrap().to_vec();
        let segment = Segment::open(&dir, 1, bytes.len() as u64).unwrap();
        let both = VectorBuf::from_bits(vec![1, 2]);
        assert_eq!(segment.aggregate(0, 32), Some(both.as_part()));
        assert_eq!(segment.aggregate(1, 0), None);

        let data_end = bytes.len() - footer::FOOTER_LEN - trailer_len(3);
        let entry = data_end - ENTRY_WORDS * 8;
        let mut level = bytes.clone();
        level[entry + 28] = 7;
        reseal(&mut level);
        assert!(refusal(&dir, &level).contains("aggregate entry 0 (vid 32): level 7"));

        let mut block = bytes.clone();
        block[entry] = 42;
        reseal(&mut block);
        assert!(refusal(&dir, &block).contains("not aligned"));
    }

    #[test]
    fn a_resealed_bad_index_is_refused() {
        let dir = MemoryDirectory::new();
        let (bytes, _, _) = sample(&dir);
        let data_end = bytes.len() - footer::FOOTER_LEN - trailer_len(3);
        let index = u64_at(&bytes, data_end) as usize;
        let entry = |i: usize, word: usize| index + (i * ENTRY_WORDS + word) * 8;

        let mut swapped = bytes.clone();
        swapped[entry(1, 0)..entry(1, 1)].copy_from_slice(&1u64.to_le_bytes());
        reseal(&mut swapped);
        assert!(refusal(&dir, &swapped).contains("vids are not strictly ascending"));

        let mut far = bytes.clone();
        far[entry(0, 1)..entry(0, 2)].copy_from_slice(&(u64::MAX - 63).to_le_bytes());
        reseal(&mut far);
        assert!(refusal(&dir, &far).contains("index entry 0 (vid 3): its data"));

        let mut shifted = bytes.clone();
        let offset = u64_at(&bytes, entry(1, 1)) + 2;
        shifted[entry(1, 1)..entry(1, 2)].copy_from_slice(&offset.to_le_bytes());
        reseal(&mut shifted);
        assert!(refusal(&dir, &shifted).contains("index entry 1 (vid 9)"));

        let mut kind = bytes.clone();
        kind[entry(0, 3) + 4] = 9;
        reseal(&mut kind);
        assert!(refusal(&dir, &kind).contains("index entry 0 (vid 3): record kind 9 is unknown"));

        let mut deleted = bytes.clone();
        deleted[entry(1, 3) + 4] = RecordKind::Deleted as u8;
        reseal(&mut deleted);
        assert!(refusal(&dir, &deleted).contains("a Deleted record holds containers"));

        let mut trailer = bytes.clone();
        trailer[data_end + 8] += 1; // one more entry than the index holds
        reseal(&mut trailer);
        assert!(refusal(&dir, &trailer).contains("index entries"));
    }

    proptest::proptest! {
        /// The galloping search finds the end of any prefix, and probes
        /// nothing past the end.
        #[test]
        fn leading_finds_the_end_of_the_prefix(len in 0usize..300, prefix in 0usize..300) {
            let prefix = prefix.min(len);
            let found = leading(len, |k| {
                assert!(k < len, "probed {k} of {len}");
                k < prefix
            });
            proptest::prop_assert_eq!(found, prefix);
        }

        /// A segment's entries between two vids are those a scan finds.
        #[test]
        fn entries_between_are_those_a_scan_finds(
            vids in proptest::collection::btree_set(0u64..200, 0..60),
            first in 0u64..210,
            len in 0u64..80,
        ) {
            let dir = MemoryDirectory::new();
            let vector = VectorBuf::from_bits(vec![1, 70_000]);
            let mut writer = SegmentWriter::create(&dir, 1).unwrap();
            for &vid in &vids {
                writer.add(vid, &[vector.as_part()]).unwrap();
            }
            let bytes = writer.finish().unwrap();
            let segment = Segment::open(&dir, 1, bytes).unwrap();
            let all = 0..vids.len();
            let last = first + len;
            let scanned: Vec<usize> = vids
                .iter()
                .enumerate()
                .filter(|&(_, &vid)| (first..=last).contains(&vid))
                .map(|(i, _)| i)
                .collect();
            let found: Vec<usize> = segment.entries_between(all.clone(), first, last).collect();
            proptest::prop_assert_eq!(found, scanned);
            let from = vids.iter().position(|&vid| vid >= first).unwrap_or(vids.len());
            proptest::prop_assert_eq!(segment.first_entry_from(all, first), from);
        }
    }
}
