//! The intersection (AND) of terms, and its count.
//!
//! Both walk the keys of the term with the fewest containers and find each
//! other term's container with a cursor (keys only ascend), reusing one
//! buffer for the whole walk. Where every term is dense, containers that sit
//! one after another in every term coalesce into runs, which the fill ANDs
//! with the fused kernel and the count feeds to the fused AND + popcount.

use rayon::prelude::*;

use super::{CHUNK_WORDS, PartSplitter, PlannedPart, check_fill, parallel, run_parts, task_count};
use crate::kernels::Kernels;
use crate::vector::{
    CONTAINER_WORDS, ContainerRef, DenseContainer, MalformedPart, VectorBuf, VectorPart,
};

/// A term of an intersection: the key-disjoint parts, ascending, whose union is its vector.
#[derive(Debug, Clone, Copy)]
pub struct Term<'t, 'a> {
    parts: &'t [VectorPart<'a>],
}

impl<'t, 'a> Term<'t, 'a> {
    /// Checks that the parts' key ranges ascend without overlapping.
    pub fn new(parts: &'t [VectorPart<'a>]) -> Result<Self, MalformedPart> {
        let mut last: Option<u16> = None;
        for part in parts {
            if let Some((first, end)) = part.key_range() {
                if last.is_some_and(|l| l >= first) {
                    return Err(MalformedPart(
                        "the parts of a term overlap or are out of key order".into(),
                    ));
                }
                last = Some(end);
            }
        }
        Ok(Term { parts })
    }

    /// The container with key `key`, if the term has one.
    pub fn container(&self, key: u16) -> Option<ContainerRef<'a>> {
        let i = self
            .parts
            .partition_point(|p| p.key_range().is_some_and(|(_, end)| end < key));
        self.parts.get(i)?.container(key)
    }

    fn container_count(&self) -> usize {
        self.parts.iter().map(|p| p.container_count()).sum()
    }

    fn containers(&self) -> impl Iterator<Item = (u16, ContainerRef<'a>)> + 't {
        self.parts.iter().flat_map(|p| p.containers())
    }

    /// `len` words from `offset` words into the dense container at `loc`.
    fn words(&self, loc: DenseLoc, offset: usize, len: usize) -> &'a [u64] {
        let start = loc.index as usize * CONTAINER_WORDS + offset;
        &self.parts[loc.part as usize].dense_words()[start..start + len]
    }
}

/// Where a term's dense container is: its part, and its index among that
/// part's dense containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct DenseLoc {
    part: u32,
    index: u32,
}

/// Finds a term's containers at ascending keys.
struct Cursor<'t, 'a> {
    parts: &'t [VectorPart<'a>],
    part: usize,
    dense: usize,
    sparse: usize,
}

impl<'t, 'a> Cursor<'t, 'a> {
    fn new(term: &Term<'t, 'a>) -> Self {
        Cursor {
            parts: term.parts,
            part: 0,
            dense: 0,
            sparse: 0,
        }
    }

    /// The container at `key` and where it is if dense; `key` must not be
    /// below the previous one asked.
    fn seek(&mut self, key: u16) -> Option<(ContainerRef<'a>, DenseLoc)> {
        loop {
            let part = self.parts.get(self.part)?;
            if part.key_range().is_some_and(|(_, last)| last >= key) {
                break;
            }
            (self.part, self.dense, self.sparse) = (self.part + 1, 0, 0);
        }
        let part = &self.parts[self.part];
        let dense_keys = part.dense_keys();
        self.dense = seek_key(dense_keys, self.dense, key);
        if dense_keys.get(self.dense) == Some(&key) {
            let start = self.dense * CONTAINER_WORDS;
            let words: &'a DenseContainer = part.dense_words()[start..start + CONTAINER_WORDS]
                .try_into()
                .expect("a dense container is CONTAINER_WORDS words");
            let loc = DenseLoc {
                part: self.part as u32,
                index: self.dense as u32,
            };
            return Some((ContainerRef::Dense(words), loc));
        }
        let sparse_keys = part.sparse_keys();
        self.sparse = seek_key(sparse_keys, self.sparse, key);
        if sparse_keys.get(self.sparse) != Some(&key) {
            return None;
        }
        Some((
            ContainerRef::Sparse(part.sparse_container(self.sparse)),
            DenseLoc::default(),
        ))
    }
}

/// The first index at or after `from` whose key is not below `key`:
/// galloping, since the next key is usually close.
fn seek_key(keys: &[u16], from: usize, key: u16) -> usize {
    let mut step = 1;
    let mut low = from;
    while let Some(&k) = keys.get(low) {
        if k >= key {
            return low;
        }
        let probe = low + step;
        if keys.get(probe).is_none_or(|&k| k >= key) {
            let end = probe.min(keys.len());
            return low + 1 + keys[low + 1..end].partition_point(|&k| k < key);
        }
        low = probe;
        step *= 2;
    }
    low
}

/// Calls `visit` for each key, ascending, at which every term has a
/// container, with the containers and (where dense) where they are.
fn walk<'a>(terms: &[Term<'_, 'a>], mut visit: impl FnMut(u16, &[ContainerRef<'a>], &[DenseLoc])) {
    let Some(smallest) = terms.iter().min_by_key(|t| t.container_count()) else {
        return;
    };
    let mut cursors: Vec<Cursor<'_, 'a>> = terms.iter().map(Cursor::new).collect();
    let mut containers = Vec::with_capacity(terms.len());
    let mut locs = Vec::with_capacity(terms.len());
    'keys: for (key, _) in smallest.containers() {
        containers.clear();
        locs.clear();
        for cursor in &mut cursors {
            let Some((container, loc)) = cursor.seek(key) else {
                continue 'keys;
            };
            containers.push(container);
            locs.push(loc);
        }
        visit(key, &containers, &locs);
    }
}

fn all_dense(containers: &[ContainerRef<'_>]) -> bool {
    containers
        .iter()
        .all(|c| matches!(c, ContainerRef::Dense(_)))
}

/// Positions set in every container, where at least one is sparse.
fn sparse_intersection<'c>(containers: &'c [ContainerRef<'_>]) -> impl Iterator<Item = u16> + 'c {
    let shortest = containers
        .iter()
        .filter_map(|c| match c {
            ContainerRef::Sparse(values) => Some(*values),
            ContainerRef::Dense(_) => None,
        })
        .min_by_key(|values| values.len())
        .unwrap_or(&[]);
    shortest
        .iter()
        .copied()
        .filter(move |&low| containers.iter().all(|c| c.contains(low)))
}

/// Runs of keys where every term is dense and each term's containers follow
/// one another in one part: each run is one slice per term.
#[derive(Debug, Clone, Default)]
struct AndRuns {
    /// Per run: its first output word and its length in words.
    runs: Vec<(usize, usize)>,
    /// Per run, one per term: where the term's first container of the run is.
    starts: Vec<DenseLoc>,
    last_key: Option<u16>,
    words: usize,
}

impl AndRuns {
    fn push(&mut self, key: u16, locs: &[DenseLoc]) {
        let n = locs.len();
        let extends = self
            .last_key
            .is_some_and(|last| u32::from(last) + 1 == u32::from(key))
            && self.runs.last().is_some_and(|&(_, len)| {
                let count = (len / CONTAINER_WORDS) as u32;
                let starts = &self.starts[self.starts.len() - n..];
                starts
                    .iter()
                    .zip(locs)
                    .all(|(s, l)| s.part == l.part && s.index + count == l.index)
            });
        if extends {
            self.runs.last_mut().expect("a run to extend").1 += CONTAINER_WORDS;
        } else {
            self.runs.push((self.words, CONTAINER_WORDS));
            self.starts.extend_from_slice(locs);
        }
        self.last_key = Some(key);
        self.words += CONTAINER_WORDS;
    }

    /// The runs cut into pieces of at most [`CHUNK_WORDS`]: (run, offset, length).
    fn pieces(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.runs.iter().enumerate().flat_map(|(r, &(_, len))| {
            (0..len)
                .step_by(CHUNK_WORDS)
                .map(move |offset| (r, offset, CHUNK_WORDS.min(len - offset)))
        })
    }

    /// The slices of every term for a piece of run `run`.
    fn sources<'a>(
        &self,
        terms: &[Term<'_, 'a>],
        (run, offset, len): (usize, usize, usize),
        srcs: &mut Vec<&'a [u64]>,
    ) {
        let starts = &self.starts[run * terms.len()..(run + 1) * terms.len()];
        srcs.clear();
        srcs.extend(
            terms
                .iter()
                .zip(starts)
                .map(|(t, &loc)| t.words(loc, offset, len)),
        );
    }
}

/// The plan of an intersection (AND) of terms.
#[derive(Debug, Clone)]
pub struct IntersectionPlan {
    parts: Vec<PlannedPart>,
    fills: Vec<AndRuns>,
    terms: usize,
}

impl IntersectionPlan {
    /// Plans the intersection of `terms`. An output container is dense where
    /// every term is dense (it may turn out all zero); sparse containers are
    /// computed now. No terms at all is the empty vector.
    pub fn new(terms: &[Term<'_, '_>]) -> IntersectionPlan {
        let mut splitter = PartSplitter::new();
        let mut fills = vec![AndRuns::default()];
        let mut values = Vec::new();
        walk(terms, |key, containers, locs| {
            if all_dense(containers) {
                let part = splitter.dense(key);
                if part == fills.len() {
                    fills.push(AndRuns::default());
                }
                fills[part].push(key, locs);
            } else {
                values.clear();
                values.extend(sparse_intersection(containers));
                if !values.is_empty() {
                    splitter.sparse(key, &values);
                }
            }
        });
        let parts = splitter.finish();
        fills.truncate(parts.len());
        IntersectionPlan {
            parts,
            fills,
            terms: terms.len(),
        }
    }

    /// The output parts, key-disjoint and ascending.
    pub fn parts(&self) -> &[PlannedPart] {
        &self.parts
    }

    /// Writes the dense containers of output part `part` into `out` (exactly
    /// [`PlannedPart::dense_word_count`] words). `terms` must be the ones the
    /// plan was made from.
    ///
    /// # Panics
    ///
    /// If `out` has the wrong length, or `terms` are not the plan's (when
    /// that shows: their number differs, or a container is out of range).
    pub fn fill<'a>(&self, part: usize, terms: &[Term<'_, 'a>], out: &mut [u64]) {
        let planned = &self.parts[part];
        check_fill(planned, out, terms.len(), self.terms);
        let runs = &self.fills[part];
        let kernels = Kernels::best();
        let and_piece = |srcs: &mut Vec<&'a [u64]>, piece, words: &mut [u64]| {
            runs.sources(terms, piece, srcs);
            kernels.write_and(words, srcs);
        };
        let mut rest = out;
        let mut pieces: Vec<(_, &mut [u64])> = runs
            .pieces()
            .map(|piece @ (_, _, len)| {
                let (words, tail) = std::mem::take(&mut rest).split_at_mut(len);
                rest = tail;
                (piece, words)
            })
            .collect();
        if task_count(planned.dense_word_count(), runs.words * terms.len()) <= 1 {
            let mut srcs = Vec::with_capacity(terms.len());
            for (piece, words) in pieces {
                and_piece(&mut srcs, piece, words);
            }
        } else {
            pieces.par_iter_mut().for_each_init(
                || Vec::with_capacity(terms.len()),
                |srcs, (piece, words)| and_piece(srcs, *piece, words),
            );
        }
    }

    /// Runs the whole fold into owned vectors, one per output part.
    pub fn run(&self, terms: &[Term<'_, '_>]) -> Vec<VectorBuf> {
        run_parts(&self.parts, |i, words| self.fill(i, terms, words))
    }
}

/// Number of bits in the intersection of `terms`, without building it.
pub fn intersection_count<'a>(terms: &[Term<'_, 'a>]) -> u64 {
    let mut runs = AndRuns::default();
    let mut count = 0;
    walk(terms, |key, containers, locs| {
        if all_dense(containers) {
            runs.push(key, locs);
        } else {
            count += sparse_intersection(containers).count() as u64;
        }
    });
    let kernels = Kernels::best();
    let count_piece = |srcs: &mut Vec<&'a [u64]>, piece| {
        runs.sources(terms, piece, srcs);
        kernels.and_count(srcs)
    };
    count
        + if !parallel(runs.words * terms.len()) {
            let mut srcs = Vec::with_capacity(terms.len());
            runs.pieces()
                .map(|piece| count_piece(&mut srcs, piece))
                .sum::<u64>()
        } else {
            runs.pieces()
                .collect::<Vec<_>>()
                .into_par_iter()
                .map_init(
                    || Vec::with_capacity(terms.len()),
                    |srcs, piece| count_piece(srcs, piece),
                )
                .sum::<u64>()
        }
}
