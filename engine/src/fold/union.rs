//! The union (OR) of any number of parts.
//!
//! Planning touches each input container once, without sorting them: the
//! key space has only 2^16 keys, so per-key counters in a per-thread scratch
//! (reset only where touched) say which output containers exist, which are
//! dense, and where each input container's words or values go. Filling then
//! streams coalesced runs of input words through the fused multi-source OR,
//! chunk by chunk, and scatters the sparse inputs that land in dense outputs.
//!
//! A chunk whose inputs' OR becomes all ones stops reading them (an OR of
//! many dense vectors saturates quickly): inputs are folded in the order
//! given, so a caller puts the widest first, and the fill reports what it
//! left unread ([`Unread`]).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::ops::Range;

use rayon::prelude::*;

use super::{
    CHUNK_WORDS, KeptWords, PartSplitter, PlannedPart, check_fill, run_parts, task_count,
    word_ranges,
};
use crate::kernels::Kernels;
use crate::vector::{
    CONTAINER_WORDS, DenseContainer, PART_MAX_DENSE, SPARSE_MAX, VectorBuf, VectorPart,
};

/// Consecutive dense containers of one input that land on consecutive
/// output slots of one part: folded as one slice.
#[derive(Debug, Clone, Copy)]
struct DenseRun {
    /// Index of the input part.
    input: u32,
    /// First word in the input's dense words.
    src: usize,
    /// First word in the output part's words.
    out: usize,
    /// Length in words.
    len: usize,
}

impl DenseRun {
    fn end(&self) -> usize {
        self.out + self.len
    }
}

/// A sparse input container that lands in a dense output container.
#[derive(Debug, Clone, Copy, Default)]
struct Scatter {
    /// Dense slot in the output part.
    slot: u32,
    /// Index of the input part.
    input: u32,
    /// Index of the sparse container in the input part.
    container: u32,
}

/// What filling one output part reads.
#[derive(Debug, Clone, Default)]
struct UnionFill {
    /// Ascending by `out`.
    runs: Vec<DenseRun>,
    /// Ascending by `slot`.
    scatters: Vec<Scatter>,
    /// Dense input words, plus four per sparse value scattered (a scatter
    /// costs about what streaming a few words does): decides parallelism.
    input_words: usize,
}

/// The bytes of each input a union's fill did not read: dense words, and
/// sparse values it would have scattered, of output chunks that were
/// already all ones when their turn came.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unread {
    bytes: Vec<u64>,
}

impl Unread {
    fn new(inputs: usize) -> Unread {
        Unread {
            bytes: vec![0; inputs],
        }
    }

    /// Bytes left unread of the inputs at `inputs` (indices into the
    /// inputs of the fill; those past its inputs count nothing).
    pub fn bytes(&self, inputs: Range<usize>) -> u64 {
        let end = inputs.end.min(self.bytes.len());
        self.bytes
            .get(inputs.start.min(end)..end)
            .map_or(0, |bytes| bytes.iter().sum())
    }

    /// Bytes left unread of every input.
    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// Adds the counts of `other` (another fill of the same inputs) to these.
    pub fn add(&mut self, other: &Unread) {
        if self.bytes.len() < other.bytes.len() {
            self.bytes.resize(other.bytes.len(), 0);
        }
        for (a, b) in self.bytes.iter_mut().zip(&other.bytes) {
            *a += b;
        }
    }

    fn merged(mut self, other: Unread) -> Unread {
        self.add(&other);
        self
    }

    fn skip(&mut self, input: u32, bytes: usize) {
        self.bytes[input as usize] += bytes as u64;
    }
}

/// The plan of a union (OR) of any number of parts, in any order, overlapping or not.
#[derive(Debug, Clone)]
pub struct UnionPlan {
    parts: Vec<PlannedPart>,
    fills: Vec<UnionFill>,
    inputs: usize,
}

impl UnionPlan {
    /// Plans the union of `inputs`. An output container is dense where any
    /// input is dense or the sparse inputs hold more than [`SPARSE_MAX`] bits
    /// between them (counting repeats).
    pub fn new(inputs: &[VectorPart<'_>]) -> UnionPlan {
        SCRATCH.with_borrow_mut(|scratch| scratch.plan(inputs))
    }

    /// The output parts, key-disjoint and ascending.
    pub fn parts(&self) -> &[PlannedPart] {
        &self.parts
    }

    /// The output parts, kept after the fills: each reads as a vector part
    /// over the words filled for it ([`PlannedPart::with_words`]).
    pub fn into_parts(self) -> Vec<PlannedPart> {
        self.parts
    }

    /// Fills every output part into `words`, one part's dense words after
    /// the other (read them back with [`filled_parts`](super::filled_parts)).
    /// `words` grows to their total if it is shorter and never shrinks (the
    /// words past the total are left as they were): since a fill overwrites
    /// every word, only words it never had are zeroed, so a buffer kept
    /// between folds of different sizes costs no clearing. Returns what the
    /// fills left unread.
    pub fn fill_all(&self, inputs: &[VectorPart<'_>], words: &mut Vec<u64>) -> Unread {
        let total = self.parts.iter().map(PlannedPart::dense_word_count).sum();
        if words.len() < total {
            words.resize(total, 0);
        }
        let mut unread = Unread::default();
        for (i, range) in word_ranges(&self.parts).enumerate() {
            unread.add(&self.fill(i, inputs, &mut words[range]));
        }
        unread
    }

    /// Writes the dense containers of output part `part` into `out`, which
    /// must hold exactly [`PlannedPart::dense_word_count`] words (anything in
    /// it is overwritten). `inputs` must be the parts the plan was made from.
    /// Where an output chunk becomes all ones, the inputs after that point
    /// (in the order of `inputs`) are not read: the result says how many of
    /// their bytes were skipped.
    ///
    /// # Panics
    ///
    /// If `out` has the wrong length, or `inputs` are not the plan's (when
    /// that shows: their number differs, or a container is out of range).
    pub fn fill(&self, part: usize, inputs: &[VectorPart<'_>], out: &mut [u64]) -> Unread {
        let planned = &self.parts[part];
        check_fill(planned, out, inputs.len(), self.inputs);
        let fill = &self.fills[part];
        let tasks = task_count(out.len(), fill.input_words);
        let mut unread = Unread::new(inputs.len());
        if tasks <= 1 {
            fill_range(&fill.runs, &fill.scatters, inputs, 0, out, &mut unread);
        } else if out.len() < 2 * CHUNK_WORDS * rayon::current_num_threads() && fill.runs.len() > 1
        {
            fill_by_inputs(fill, inputs, out, &mut unread);
        } else {
            let task_words = out.len().div_ceil(tasks).next_multiple_of(CONTAINER_WORDS);
            let skipped = out
                .par_chunks_mut(task_words)
                .enumerate()
                .map(|(t, words)| {
                    let mut unread = Unread::new(inputs.len());
                    let lo = t * task_words;
                    fill_range(&fill.runs, &fill.scatters, inputs, lo, words, &mut unread);
                    unread
                })
                .reduce_with(Unread::merged);
            if let Some(skipped) = skipped {
                unread.add(&skipped);
            }
        }
        unread
    }

    /// Runs the whole fold into owned vectors, one per output part.
    pub fn run(&self, inputs: &[VectorPart<'_>]) -> Vec<VectorBuf> {
        run_parts(&self.parts, |i, words| {
            self.fill(i, inputs, words);
        })
    }
}

/// Fills a small output from many inputs: the runs are dealt round-robin to
/// one group per core, each group folds into its own copy of the output
/// (each input still streams in long runs), and the copies are ORed
/// together. Splitting a small output instead would cut each input into
/// pieces too short for the prefetcher. (More groups than cores balanced
/// better in theory but measured slower: more copies to merge.)
fn fill_by_inputs(
    fill: &UnionFill,
    inputs: &[VectorPart<'_>],
    out: &mut [u64],
    unread: &mut Unread,
) {
    let groups = rayon::current_num_threads().min(fill.runs.len());
    let group_runs =
        |g: usize| -> Vec<DenseRun> { fill.runs.iter().skip(g).step_by(groups).copied().collect() };
    let len = out.len();
    let (_, rest) = rayon::join(
        || fill_range(&group_runs(0), &fill.scatters, inputs, 0, out, unread),
        || {
            (1..groups)
                .into_par_iter()
                .map(|g| {
                    let mut words = KeptWords::zeroed(len);
                    let mut unread = Unread::new(inputs.len());
                    fill_range(&group_runs(g), &[], inputs, 0, &mut words, &mut unread);
                    (words, unread)
                })
                .reduce_with(|(mut acc, unread), (words, more)| {
                    Kernels::best().or_into(&mut acc, &words);
                    (acc, unread.merged(more))
                })
        },
    );
    if let Some((words, more)) = rest {
        Kernels::best().or_into(out, &words);
        unread.add(&more);
    }
}

/// A window of one input's words folded into an output chunk.
struct Piece<'a> {
    /// First word in the chunk.
    start: usize,
    /// Length in words.
    len: usize,
    /// Index of the input part.
    input: u32,
    words: &'a [u64],
}

/// Fills `out`, the output part's words from `lo` on, chunk by chunk, from
/// `runs` (ascending by output word, inputs in order at each) and
/// `scatters` (ascending by slot); counts in `unread` the inputs it skipped
/// where a chunk was already all ones.
fn fill_range(
    runs: &[DenseRun],
    scatters: &[Scatter],
    inputs: &[VectorPart<'_>],
    lo: usize,
    out: &mut [u64],
    unread: &mut Unread,
) {
    let kernels = Kernels::best();
    let mut next_run = 0;
    let mut active: Vec<DenseRun> = Vec::new();
    let mut pieces: Vec<Piece<'_>> = Vec::new();
    let mut srcs: Vec<&[u64]> = Vec::new();
    let first_slot = (lo / CONTAINER_WORDS) as u32;
    let mut next_scatter = scatters.partition_point(|s| s.slot < first_slot);
    let mut c0 = lo;
    for chunk in out.chunks_mut(CHUNK_WORDS) {
        let c1 = c0 + chunk.len();
        active.retain(|r| r.end() > c0);
        while let Some(run) = runs.get(next_run).filter(|r| r.out < c1) {
            if run.end() > c0 {
                active.push(*run);
            }
            next_run += 1;
        }
        pieces.clear();
        for run in &active {
            let (start, end) = (run.out.max(c0), run.end().min(c1));
            let words = inputs[run.input as usize].dense_words();
            let src = run.src + (start - run.out);
            pieces.push(Piece {
                start: start - c0,
                len: end - start,
                input: run.input,
                words: &words[src..src + (end - start)],
            });
        }
        // Equal windows side by side, the widest first at each start, each
        // window's inputs in the caller's order.
        pieces.sort_unstable_by_key(|p| (p.start, Reverse(p.len), p.input));
        let overwrite = pieces
            .first()
            .is_some_and(|p| p.start == 0 && p.len == chunk.len());
        if !overwrite {
            chunk.fill(0);
        }
        // Whether the whole chunk is all ones: nothing more can change it.
        let mut full = false;
        for (i, group) in pieces
            .chunk_by(|a, b| (a.start, a.len) == (b.start, b.len))
            .enumerate()
        {
            let (start, len) = (group[0].start, group[0].len);
            let read = if full {
                Some(0)
            } else {
                srcs.clear();
                srcs.extend(group.iter().map(|p| p.words));
                let target = &mut chunk[start..start + len];
                if i == 0 && overwrite {
                    kernels.write_or_until_full(target, &srcs)
                } else {
                    kernels.or_many_until_full(target, &srcs)
                }
            };
            if let Some(read) = read {
                full |= len == chunk.len();
                for piece in &group[read..] {
                    unread.skip(piece.input, piece.len * 8);
                }
            }
        }
        let end_slot = (c1 / CONTAINER_WORDS) as u32;
        while let Some(scatter) = scatters.get(next_scatter).filter(|s| s.slot < end_slot) {
            let input = &inputs[scatter.input as usize];
            let values = input.sparse_container(scatter.container as usize);
            next_scatter += 1;
            if full {
                unread.skip(scatter.input, size_of_val(values));
                continue;
            }
            let at = scatter.slot as usize * CONTAINER_WORDS - c0;
            let container = (&mut chunk[at..at + CONTAINER_WORDS])
                .try_into()
                .expect("a dense container is CONTAINER_WORDS words");
            set_positions(container, values);
        }
        c0 = c1;
    }
}

/// Sets the bits at `positions` in one dense container.
fn set_positions(words: &mut DenseContainer, positions: &[u16]) {
    for &low in positions {
        words[usize::from(low) / 64] |= 1 << (low % 64);
    }
}

/// Number of container keys.
const KEYS: usize = 1 << 16;

thread_local! {
    static SCRATCH: RefCell<KeyScratch> = RefCell::new(KeyScratch::new());
}

/// Per-key counters for planning a union, kept per thread so that a plan
/// allocates nothing proportional to the key space. Between plans every
/// entry is zero; a plan resets exactly the entries it touched.
struct KeyScratch {
    /// Keys some input has a container at.
    touched: Vec<u64>,
    /// Keys whose output container is dense.
    dense: Vec<u64>,
    /// Per key: sparse values in the inputs; then the output slot (dense
    /// keys) or the end of its values so far in the gathered values (sparse keys).
    values: Vec<u32>,
    /// Per key: sparse input containers; then the next scatter index (dense keys).
    containers: Vec<u32>,
    /// One container's positions, for merging sparse containers.
    positions: Vec<u64>,
    /// False while a plan runs: a plan that panicked left dirty entries.
    clean: bool,
}

fn set_bit(bits: &mut [u64], key: u16) {
    bits[usize::from(key) / 64] |= 1 << (key % 64);
}

fn has_bit(bits: &[u64], key: u16) -> bool {
    bits[usize::from(key) / 64] >> (key % 64) & 1 == 1
}

/// Sorts `values` and drops repeats, in place; returns how many distinct
/// values now lead it. Many values go through `bitmap` (one container's
/// words and a summary word per 64 of them, all zero before and after):
/// setting their bits and reading back only the words touched avoids the
/// branch mispredictions of sorting random values.
fn sort_distinct(values: &mut [u16], bitmap: &mut [u64]) -> usize {
    if values.len() <= 16 {
        values.sort_unstable();
        let mut len = 0;
        for i in 0..values.len() {
            if i == 0 || values[i] != values[len - 1] {
                values[len] = values[i];
                len += 1;
            }
        }
        return len;
    }
    let (words, summary) = bitmap.split_at_mut(CONTAINER_WORDS);
    for &value in values.iter() {
        set_bit(words, value);
        set_bit(summary, value / 64);
    }
    let mut len = 0;
    for_each_key(summary, |w| {
        let w = usize::from(w);
        let mut word = std::mem::take(&mut words[w]);
        while word != 0 {
            values[len] = (w * 64) as u16 + word.trailing_zeros() as u16;
            len += 1;
            word &= word - 1;
        }
    });
    summary.fill(0);
    len
}

/// Visits the keys set in `bits`, ascending.
fn for_each_key(bits: &[u64], f: impl FnMut(u16)) {
    for_each_key_in(bits, 0..bits.len(), f);
}

/// Visits the keys set in the words `words` of `bits`, ascending.
fn for_each_key_in(bits: &[u64], words: Range<usize>, mut f: impl FnMut(u16)) {
    let first = words.start;
    for (w, &word) in bits[words].iter().enumerate() {
        let mut word = word;
        while word != 0 {
            f(((first + w) * 64) as u16 + word.trailing_zeros() as u16);
            word &= word - 1;
        }
    }
}

impl KeyScratch {
    fn new() -> Self {
        KeyScratch {
            touched: vec![0; KEYS / 64],
            dense: vec![0; KEYS / 64],
            values: vec![0; KEYS],
            containers: vec![0; KEYS],
            positions: vec![0; CONTAINER_WORDS + CONTAINER_WORDS / 64],
            clean: true,
        }
    }

    fn plan(&mut self, inputs: &[VectorPart<'_>]) -> UnionPlan {
        if !self.clean {
            *self = KeyScratch::new();
        }
        self.clean = false;

        // Which keys exist, which are dense in some input, how many sparse
        // values; and the span of `touched`'s words they fall in, so that
        // only that span is swept and cleared (a vector of 2^20 bits uses
        // one word of the 1,024).
        let (mut lo, mut hi) = (KEYS / 64, 0);
        let mut widen = |key: u16| {
            let w = usize::from(key) / 64;
            lo = lo.min(w);
            hi = hi.max(w + 1);
        };
        for part in inputs {
            for &key in part.dense_keys() {
                widen(key);
                set_bit(&mut self.touched, key);
                set_bit(&mut self.dense, key);
            }
            for (key, values) in part.sparse_containers() {
                widen(key);
                set_bit(&mut self.touched, key);
                let k = usize::from(key);
                self.values[k] = self.values[k].saturating_add(values.len() as u32);
                self.containers[k] += 1;
            }
        }

        // Decide each key; give dense keys their slot and scatter range,
        // sparse keys their range of gathered values.
        let (mut slots, mut scatter_count, mut value_count) = (0u32, 0u32, 0u32);
        let span = lo.min(hi)..hi;
        for_each_key_in(&self.touched, span.clone(), |key| {
            let k = usize::from(key);
            if has_bit(&self.dense, key) || self.values[k] as usize > SPARSE_MAX {
                set_bit(&mut self.dense, key);
                self.values[k] = slots;
                slots += 1;
                let n = self.containers[k];
                self.containers[k] = scatter_count;
                scatter_count += n;
            } else {
                let n = self.values[k];
                self.values[k] = value_count;
                value_count += n;
            }
        });

        // Place every input container.
        let part_count = (slots as usize).div_ceil(PART_MAX_DENSE).max(1);
        let mut fills = vec![UnionFill::default(); part_count];
        let mut scatters = vec![Scatter::default(); scatter_count as usize];
        // Per part: scatters, and sparse values they set.
        let mut per_part = vec![(0usize, 0usize); part_count];
        let mut gathered = vec![0u16; value_count as usize];
        for (i, part) in inputs.iter().enumerate() {
            let input = i as u32;
            let keys = part.dense_keys();
            let mut first = 0;
            while first < keys.len() {
                let slot = self.values[usize::from(keys[first])] as usize;
                let mut end = first + 1;
                while end < keys.len()
                    && keys[end] == keys[end - 1] + 1
                    && !(slot + end - first).is_multiple_of(PART_MAX_DENSE)
                {
                    end += 1;
                }
                fills[slot / PART_MAX_DENSE].runs.push(DenseRun {
                    input,
                    src: first * CONTAINER_WORDS,
                    out: slot % PART_MAX_DENSE * CONTAINER_WORDS,
                    len: (end - first) * CONTAINER_WORDS,
                });
                first = end;
            }
            for (c, (key, values)) in part.sparse_containers().enumerate() {
                let k = usize::from(key);
                if has_bit(&self.dense, key) {
                    let slot = self.values[k] as usize;
                    scatters[self.containers[k] as usize] = Scatter {
                        slot: (slot % PART_MAX_DENSE) as u32,
                        input,
                        container: c as u32,
                    };
                    self.containers[k] += 1;
                    let counts = &mut per_part[slot / PART_MAX_DENSE];
                    counts.0 += 1;
                    counts.1 += values.len();
                } else {
                    let at = self.values[k] as usize;
                    gathered[at..at + values.len()].copy_from_slice(values);
                    self.values[k] += values.len() as u32;
                }
            }
        }

        // Build the output parts in key order and reset what was touched.
        let mut splitter = PartSplitter::new();
        let mut gathered_from = 0;
        let touched = std::mem::take(&mut self.touched);
        for_each_key_in(&touched, span.clone(), |key| {
            let k = usize::from(key);
            if has_bit(&self.dense, key) {
                splitter.dense(key);
            } else {
                let values = &mut gathered[gathered_from..self.values[k] as usize];
                gathered_from = self.values[k] as usize;
                let len = sort_distinct(values, &mut self.positions);
                splitter.sparse(key, &values[..len]);
            }
            self.values[k] = 0;
            self.containers[k] = 0;
        });
        self.touched = touched;
        self.touched[span.clone()].fill(0);
        self.dense[span].fill(0);
        self.clean = true;

        let mut scatters = scatters.into_iter();
        for (fill, &(count, values)) in fills.iter_mut().zip(&per_part) {
            fill.runs.sort_unstable_by_key(|r| (r.out, r.input));
            fill.scatters = scatters.by_ref().take(count).collect();
            fill.input_words = fill.runs.iter().map(|r| r.len).sum::<usize>() + values * 4;
        }
        UnionPlan {
            parts: splitter.finish(),
            fills,
            inputs: inputs.len(),
        }
    }
}
