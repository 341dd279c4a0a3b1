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
//! index         (8-byte aligned) one entry per vector, ascending vid:
//!                 vid u64 | offset u64 | dense u32 | sparse u32 | values u32 | reserved u32
//! aggregate index  one entry per aggregate, ascending (level, block):
//!                 block u64 | offset u64 | dense u32 | sparse u32 | values u32 | level u32
//! trailer       index offset u64 | vector count u64 | aggregate count u64
//! footer        see `footer.rs`
//! ```
//!
//! `offset` is where the vector's words start (or its ends, if it has no
//! dense container); the other slices follow back to back, each naturally
//! aligned because the slice before it ends on a multiple of its alignment.
//!
//! An aggregate is the union of the vectors this segment holds in one
//! aligned block of vids (see `aggregate.rs`); `block` is the block's first
//! vid. Format version 1 has no aggregates and a trailer without their
//! count; it is still read.
//! All integers are little-endian, which is why bitfold builds only for
//! little-endian targets.

use std::io;
use std::ops::Range;
use std::path::PathBuf;

use super::StoreError;
use super::aggregate;
use super::footer::{self, ChecksumWriter, Kind, u64_at};
use super::storage::{Directory, FileBytes};
use crate::fold::UnionPlan;
use crate::vector::{CONTAINER_WORDS, VectorPart};

#[cfg(not(target_endian = "little"))]
compile_error!("bitfold's store files are little-endian words read in place");

pub(crate) const SEGMENT: Kind = Kind {
    magic: *b"BFOLDSEG",
    version: 2,
    name: "segment",
};

/// The oldest segment format version this build reads (version 1 has no
/// aggregates).
const OLDEST_VERSION: u32 = 1;

/// Words of one index entry.
const ENTRY_WORDS: usize = 4;

/// Bytes of the trailer before the footer.
const TRAILER_LEN: usize = 24;

/// Bytes of the trailer of a version 1 segment (no aggregate count).
const TRAILER_LEN_V1: usize = 16;

/// Alignment of a vector's dense words in the file (a cache line).
const DENSE_ALIGN: u64 = 64;

/// Dense containers merged at a time when a vector is the union of several
/// parts (512 KiB of words), so that merging a 512 MiB vector streams it.
const WINDOW_KEYS: u32 = 64;

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
struct Layout {
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
    fn layout(&self, limit: u64) -> Option<Layout> {
        let mut at = self.offset;
        let mut next = |len: u64| -> Option<Range<usize>> {
            let end = at.checked_add(len)?;
            let range = usize::try_from(at).ok()?..usize::try_from(end).ok()?;
            at = end;
            Some(range)
        };
        let layout = Layout {
            words: next(u64::from(self.dense) * CONTAINER_WORDS as u64 * 8)?,
            ends: next(u64::from(self.sparse) * 4)?,
            dense_keys: next(u64::from(self.dense) * 2)?,
            sparse_keys: next(u64::from(self.sparse) * 2)?,
            values: next(u64::from(self.values) * 2)?,
        };
        (at <= limit).then_some(layout)
    }
}

/// An open, verified segment file.
pub(crate) struct Segment {
    id: u64,
    path: PathBuf,
    bytes: FileBytes,
    /// Byte range of the vector index.
    index: Range<usize>,
    /// Byte range of the aggregate index (right after the vector index).
    aggregates: Range<usize>,
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
        let trailer_len = if version == 1 {
            TRAILER_LEN_V1
        } else {
            TRAILER_LEN
        };
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
        let segment = Segment {
            id,
            path,
            bytes,
            index,
            aggregates,
        };
        segment.verify_entries(segment.entries(), "index entry", |entry| {
            (entry.reserved != 0).then(|| "reserved field is not zero".to_owned())
        })?;
        segment.verify_entries(segment.aggregate_entries(), "aggregate entry", |entry| {
            aggregate::block_problem(entry.reserved, entry.vid)
        })?;
        Ok(segment)
    }

    /// Checks the order, alignment, bounds and part invariants of `entries`
    /// (the vector index or the aggregate index: `what` names an entry), and
    /// what `problem` says of each. Entries ascend by (reserved, vid): by vid
    /// in the vector index, whose reserved field is zero; by (level, block)
    /// in the aggregate index.
    fn verify_entries(
        &self,
        entries: &[[u64; ENTRY_WORDS]],
        what: &str,
        problem: impl Fn(&Entry) -> Option<String>,
    ) -> Result<(), StoreError> {
        let mut last: Option<(u32, u64)> = None;
        for (i, words) in entries.iter().enumerate() {
            let entry = Entry::decode(words);
            let key = (entry.reserved, entry.vid);
            let problem = if last.is_some_and(|l| l >= key) {
                Some("vids are not strictly ascending".to_owned())
            } else if let Some(problem) = problem(&entry) {
                Some(problem)
            } else if entry.dense == 0 && entry.sparse == 0 {
                Some("the vector has no containers".to_owned())
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
        let layout = entry
            .layout(self.index.start as u64)
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
            cast(bytes, layout.dense_keys, "dense keys")?,
            cast(bytes, layout.words, "dense words")?,
            cast(bytes, layout.sparse_keys, "sparse keys")?,
            cast(bytes, layout.ends, "sparse ends")?,
            cast(bytes, layout.values, "sparse values")?,
        ))
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Bytes of the file.
    pub(crate) fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

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

    /// Whether this segment has range aggregates (version 1 segments and
    /// segments holding no two vids in one block have none).
    pub(crate) fn has_aggregates(&self) -> bool {
        !self.aggregates.is_empty()
    }

    /// The aggregate of the block of level `level` starting at vid `block`:
    /// the union of this segment's vectors in that block, if it has one.
    pub(crate) fn aggregate(&self, level: usize, block: u64) -> Option<VectorPart<'_>> {
        let entries = self.aggregate_entries();
        let key = (level as u64, block);
        let i = entries
            .binary_search_by_key(&key, |entry| (entry[3] >> 32, entry[0]))
            .ok()?;
        let part = self.slices(&Entry::decode(&entries[i]), VectorPart::from_verified);
        Some(part.expect("every aggregate was verified when the segment was opened"))
    }

    /// The entries among `within` whose vids lie in `first..=last`.
    pub(crate) fn entries_between(
        &self,
        within: Range<usize>,
        first: u64,
        last: u64,
    ) -> Range<usize> {
        let entries = &self.entries()[within.clone()];
        let start = entries.partition_point(|entry| entry[0] < first);
        let end = start + entries[start..].partition_point(|entry| entry[0] <= last);
        within.start + start..within.start + end
    }

    pub(crate) fn vector_count(&self) -> usize {
        self.entries().len()
    }

    /// The vid of the `i`-th vector.
    pub(crate) fn vid_at(&self, i: usize) -> u64 {
        self.entries()[i][0]
    }

    /// The `i`-th vector.
    pub(crate) fn part_at(&self, i: usize) -> VectorPart<'_> {
        // The layout and slices were checked when the segment was opened, and
        // the bytes have not changed since; this only rebuilds the view.
        self.slices(&self.entry(i), VectorPart::from_verified)
            .expect("every vector was verified when the segment was opened")
    }

    fn find(&self, vid: u64) -> Option<usize> {
        self.entries()
            .binary_search_by_key(&vid, |entry| entry[0])
            .ok()
    }

    /// Whether this segment holds a part of vector `vid`.
    pub(crate) fn contains(&self, vid: u64) -> bool {
        self.find(vid).is_some()
    }

    /// The vector `vid`, if this segment holds a part of it.
    pub(crate) fn get(&self, vid: u64) -> Option<VectorPart<'_>> {
        Some(self.part_at(self.find(vid)?))
    }
}

/// The small slices of one vector, gathered while its words stream out.
#[derive(Default)]
struct Metadata {
    dense_keys: Vec<u16>,
    sparse_keys: Vec<u16>,
    sparse_ends: Vec<u32>,
    sparse_values: Vec<u16>,
}

impl Metadata {
    fn clear(&mut self) {
        self.dense_keys.clear();
        self.sparse_keys.clear();
        self.sparse_ends.clear();
        self.sparse_values.clear();
    }
}

/// Writes a new segment, vector by vector in ascending vid order.
pub(crate) struct SegmentWriter {
    out: ChecksumWriter,
    index: Vec<[u64; ENTRY_WORDS]>,
    aggregates: Vec<[u64; ENTRY_WORDS]>,
    last_vid: Option<u64>,
    metadata: Metadata,
    window_words: Vec<u64>,
}

/// The window `[first, end)` of one input of a union, as index ranges.
struct WindowRange {
    dense: Range<usize>,
    sparse: Range<usize>,
    values: Range<usize>,
}

impl SegmentWriter {
    /// Starts segment `id` in `dir`; it appears only when [`SegmentWriter::finish`]ed.
    pub(crate) fn create(dir: &dyn Directory, id: u64) -> Result<SegmentWriter, StoreError> {
        Ok(SegmentWriter {
            out: ChecksumWriter::new(dir.create(&segment_name(id))?),
            index: Vec::new(),
            aggregates: Vec::new(),
            last_vid: None,
            metadata: Metadata::default(),
            window_words: Vec::new(),
        })
    }

    /// Vectors added so far.
    pub(crate) fn vector_count(&self) -> u64 {
        self.index.len() as u64
    }

    /// Writes vector `vid` as the union of `inputs` (nothing if they are all
    /// empty). Vids must be added in strictly ascending order.
    pub(crate) fn add(&mut self, vid: u64, inputs: &[VectorPart<'_>]) -> Result<(), StoreError> {
        assert!(
            self.last_vid.is_none_or(|last| last < vid),
            "segment vectors must be added in ascending vid order"
        );
        if let Some(entry) = self.write_vector(vid, 0, inputs)? {
            self.index.push(entry);
            self.last_vid = Some(vid);
        }
        Ok(())
    }

    /// Writes the aggregate of the block of level `level` starting at vid
    /// `block`, as the union of `inputs` (the parts of every vector added in
    /// that block). Aggregates may be added in any order, after the vectors
    /// or between them.
    pub(crate) fn add_aggregate(
        &mut self,
        level: usize,
        block: u64,
        inputs: &[VectorPart<'_>],
    ) -> Result<(), StoreError> {
        debug_assert!(aggregate::block_problem(level as u32, block).is_none());
        if let Some(entry) = self.write_vector(block, level as u32, inputs)? {
            self.aggregates.push(entry);
        }
        Ok(())
    }

    /// Writes the union of `inputs` and returns its index entry (`key` in
    /// the vid field, `tag` in the reserved one), or `None` if they are all
    /// empty.
    fn write_vector(
        &mut self,
        key: u64,
        tag: u32,
        inputs: &[VectorPart<'_>],
    ) -> Result<Option<[u64; ENTRY_WORDS]>, StoreError> {
        let inputs: Vec<VectorPart<'_>> =
            inputs.iter().filter(|p| !p.is_empty()).copied().collect();
        let start = match inputs.as_slice() {
            [] => return Ok(None),
            [part] => self.write_whole(part)?,
            _ => self.write_union(&inputs)?,
        };
        let metadata = std::mem::take(&mut self.metadata);
        let offset = match start {
            Some(offset) => offset,
            None => {
                self.out.pad_to(4)?;
                self.out.position()
            }
        };
        self.write_metadata(
            &metadata.dense_keys,
            &metadata.sparse_keys,
            &metadata.sparse_ends,
            &metadata.sparse_values,
        )?;
        let entry = Entry {
            vid: key,
            offset,
            dense: metadata.dense_keys.len() as u32,
            sparse: metadata.sparse_keys.len() as u32,
            values: metadata.sparse_values.len() as u32,
            reserved: tag,
        };
        self.metadata = metadata;
        self.metadata.clear();
        Ok(Some(entry.encode()))
    }

    /// Writes the words of one part and gathers its metadata; returns where
    /// the words start, if it has any.
    fn write_whole(&mut self, part: &VectorPart<'_>) -> Result<Option<u64>, StoreError> {
        let meta = &mut self.metadata;
        meta.dense_keys.extend_from_slice(part.dense_keys());
        meta.sparse_keys.extend_from_slice(part.sparse_keys());
        meta.sparse_ends.extend_from_slice(part.sparse_ends());
        meta.sparse_values.extend_from_slice(part.sparse_values());
        self.write_words(None, part.dense_words())
    }

    /// Appends dense words, aligning the vector's first words; returns the
    /// vector's start once it has words.
    fn write_words(
        &mut self,
        start: Option<u64>,
        words: &[u64],
    ) -> Result<Option<u64>, StoreError> {
        if words.is_empty() {
            return Ok(start);
        }
        let start = match start {
            Some(start) => start,
            None => {
                self.out.pad_to(DENSE_ALIGN)?;
                self.out.position()
            }
        };
        self.out.write(bytemuck::cast_slice(words))?;
        Ok(Some(start))
    }

    /// Writes the union of several parts window by window, so that only
    /// [`WINDOW_KEYS`] containers of output are ever held.
    fn write_union(&mut self, inputs: &[VectorPart<'_>]) -> Result<Option<u64>, StoreError> {
        let mut cursors = vec![(0usize, 0usize); inputs.len()];
        let mut ranges: Vec<WindowRange> = Vec::with_capacity(inputs.len());
        let mut rebased_ends: Vec<Vec<u32>> = vec![Vec::new(); inputs.len()];
        let mut start = None;
        while let Some(first) = next_key(inputs, &cursors) {
            let end = u32::from(first) + WINDOW_KEYS;
            ranges.clear();
            for ((part, cursor), ends) in inputs.iter().zip(&mut cursors).zip(&mut rebased_ends) {
                let range = window(part, *cursor, end);
                *cursor = (range.dense.end, range.sparse.end);
                ends.clear();
                let base = range.values.start as u32;
                ends.extend(
                    part.sparse_ends()[range.sparse.clone()]
                        .iter()
                        .map(|&e| e - base),
                );
                ranges.push(range);
            }
            let window_parts: Vec<VectorPart<'_>> = inputs
                .iter()
                .zip(&ranges)
                .zip(&rebased_ends)
                .map(|((part, range), ends)| {
                    let words =
                        range.dense.start * CONTAINER_WORDS..range.dense.end * CONTAINER_WORDS;
                    VectorPart::from_verified(
                        &part.dense_keys()[range.dense.clone()],
                        &part.dense_words()[words],
                        &part.sparse_keys()[range.sparse.clone()],
                        ends,
                        &part.sparse_values()[range.values.clone()],
                    )
                })
                .collect();
            let plan = UnionPlan::new(&window_parts);
            for (i, planned) in plan.parts().iter().enumerate() {
                let mut words = std::mem::take(&mut self.window_words);
                words.resize(planned.dense_word_count(), 0);
                plan.fill(i, &window_parts, &mut words);
                let written = self.write_words(start, &words);
                self.window_words = words;
                start = written?;
                let meta = &mut self.metadata;
                meta.dense_keys.extend_from_slice(planned.dense_keys());
                let base = meta.sparse_values.len() as u32;
                meta.sparse_keys.extend_from_slice(planned.sparse_keys());
                meta.sparse_ends
                    .extend(planned.sparse_ends().iter().map(|&e| e + base));
                meta.sparse_values
                    .extend_from_slice(planned.sparse_values());
            }
        }
        Ok(start)
    }

    fn write_metadata(
        &mut self,
        dense_keys: &[u16],
        sparse_keys: &[u16],
        sparse_ends: &[u32],
        sparse_values: &[u16],
    ) -> Result<(), StoreError> {
        self.out.write(bytemuck::cast_slice(sparse_ends))?;
        self.out.write(bytemuck::cast_slice(dense_keys))?;
        self.out.write(bytemuck::cast_slice(sparse_keys))?;
        self.out.write(bytemuck::cast_slice(sparse_values))
    }

    /// Writes the index, trailer and footer and renames the file into place;
    /// returns its length.
    pub(crate) fn finish(mut self) -> Result<u64, StoreError> {
        self.out.pad_to(8)?;
        let index_offset = self.out.position();
        self.out.write(bytemuck::cast_slice(&self.index))?;
        self.aggregates
            .sort_unstable_by_key(|entry| (entry[3] >> 32, entry[0]));
        self.out.write(bytemuck::cast_slice(&self.aggregates))?;
        self.out.write(&index_offset.to_le_bytes())?;
        self.out.write(&(self.index.len() as u64).to_le_bytes())?;
        self.out
            .write(&(self.aggregates.len() as u64).to_le_bytes())?;
        self.out.finish(&SEGMENT)
    }
}

/// The smallest container key at or after the cursors.
fn next_key(inputs: &[VectorPart<'_>], cursors: &[(usize, usize)]) -> Option<u16> {
    inputs
        .iter()
        .zip(cursors)
        .filter_map(|(part, &(dense, sparse))| {
            let d = part.dense_keys().get(dense).copied();
            let s = part.sparse_keys().get(sparse).copied();
            d.into_iter().chain(s).min()
        })
        .min()
}

/// The containers of `part` from `cursor` with keys below `end`.
fn window(part: &VectorPart<'_>, cursor: (usize, usize), end: u32) -> WindowRange {
    let below =
        |keys: &[u16], from: usize| from + keys[from..].partition_point(|&k| u32::from(k) < end);
    let dense = cursor.0..below(part.dense_keys(), cursor.0);
    let sparse = cursor.1..below(part.sparse_keys(), cursor.1);
    let values = part.sparse_start(sparse.start)..part.sparse_start(sparse.end);
    WindowRange {
        dense,
        sparse,
        values,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VectorBuf;
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

    /// Recomputes the checksum, as a bug in a writer would have.
    fn reseal(bytes: &mut [u8]) {
        let at = bytes.len() - 16;
        let checksum = xxhash_rust::xxh3::xxh3_64(&bytes[..at]);
        bytes[at..at + 8].copy_from_slice(&checksum.to_le_bytes());
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
        assert_eq!(segment.get(3), Some(a.as_part()));
        assert_eq!(segment.get(9), Some(b.as_part()));
        assert_eq!(segment.get(4), None);
        let words = segment.get(3).unwrap().dense_words();
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

        let data_end = bytes.len() - footer::FOOTER_LEN - TRAILER_LEN;
        let entry = data_end - ENTRY_WORDS * 8;
        let mut level = bytes.clone();
        level[entry + 28] = 7;
        reseal(&mut level);
        assert!(refusal(&dir, &level).contains("aggregate entry 0 (vid 32): level 7"));

        let mut block = bytes.clone();
        block[entry] = 40;
        reseal(&mut block);
        assert!(refusal(&dir, &block).contains("not aligned"));
    }

    #[test]
    fn a_resealed_bad_index_is_refused() {
        let dir = MemoryDirectory::new();
        let (bytes, _, _) = sample(&dir);
        let data_end = bytes.len() - footer::FOOTER_LEN - TRAILER_LEN;
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

        let mut trailer = bytes.clone();
        trailer[data_end + 8] += 1; // one more entry than the index holds
        reseal(&mut trailer);
        assert!(refusal(&dir, &trailer).contains("index entries"));
    }
}
