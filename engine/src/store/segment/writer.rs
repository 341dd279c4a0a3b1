//! Writing a segment file: [`SegmentWriter`] streams vectors and aggregates
//! out, merging several parts of one vector window by window.

use std::ops::Range;

use super::{COVERS_OLDER, DENSE_ALIGN, ENTRY_WORDS, Entry, RecordKind, SEGMENT, segment_name};
use crate::fold::UnionPlan;
use crate::store::StoreError;
use crate::store::aggregate;
use crate::store::footer::ChecksumWriter;
use crate::store::storage::Directory;
use crate::vector::{CONTAINER_WORDS, VectorPart};

/// Dense containers merged at a time when a vector is the union of several
/// parts (512 KiB of words), so that merging a 512 MiB vector streams it.
const WINDOW_KEYS: u32 = 64;

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
    flags: u64,
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
            flags: 0,
            metadata: Metadata::default(),
            window_words: Vec::new(),
        })
    }

    /// Vectors added so far.
    pub(crate) fn vector_count(&self) -> u64 {
        self.index.len() as u64
    }

    /// Writes vector `vid` as the union of `inputs` (nothing if they are all
    /// empty): a `set` record. Vids must be added in strictly ascending order.
    pub(crate) fn add(&mut self, vid: u64, inputs: &[VectorPart<'_>]) -> Result<(), StoreError> {
        self.add_record(vid, RecordKind::Set, inputs)
    }

    /// Writes a record of kind `kind` for vector `vid`, holding the union of
    /// `inputs` (which must be empty for `deleted` and `keep`). A `set`
    /// record with no bits is not written; the other kinds always are. Vids
    /// must be added in strictly ascending order.
    pub(crate) fn add_record(
        &mut self,
        vid: u64,
        kind: RecordKind,
        inputs: &[VectorPart<'_>],
    ) -> Result<(), StoreError> {
        assert!(
            self.last_vid.is_none_or(|last| last < vid),
            "segment vectors must be added in ascending vid order"
        );
        let keep_empty = kind != RecordKind::Set;
        debug_assert!(
            !matches!(kind, RecordKind::Deleted | RecordKind::Keep)
                || inputs.iter().all(VectorPart::is_empty)
        );
        if let Some(entry) = self.write_vector(vid, kind as u32, inputs, keep_empty)? {
            self.index.push(entry);
            self.last_vid = Some(vid);
        }
        Ok(())
    }

    /// Marks the segment's aggregates as covering every vector existing in
    /// their block, older segments' included (see [`COVERS_OLDER`]).
    pub(crate) fn set_covers_older(&mut self) {
        self.flags |= COVERS_OLDER;
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
        if let Some(entry) = self.write_vector(block, level as u32, inputs, false)? {
            self.aggregates.push(entry);
        }
        Ok(())
    }

    /// Writes the union of `inputs` and returns its index entry (`key` in
    /// the vid field, `tag` in the last one), or `None` if they are all
    /// empty and not `keep_empty`.
    fn write_vector(
        &mut self,
        key: u64,
        tag: u32,
        inputs: &[VectorPart<'_>],
        keep_empty: bool,
    ) -> Result<Option<[u64; ENTRY_WORDS]>, StoreError> {
        let inputs: Vec<VectorPart<'_>> =
            inputs.iter().filter(|p| !p.is_empty()).copied().collect();
        let start = match inputs.as_slice() {
            [] if !keep_empty => return Ok(None),
            [] => None,
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
        self.out.write(&self.flags.to_le_bytes())?;
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
