//! Vectors on the wire: a list of `Part`s, each nine little-endian `Data`
//! fields read in place.
//!
//! Reading casts each `Data` to its element type with
//! `bytemuck::try_cast_slice` (messages live in word-aligned buffers, so this
//! is zero-copy in practice; an unaligned buffer is copied) and validates
//! the part with [`VectorPart::new`]. Writing either copies a part or lets a
//! planned fold fill the dense words straight into the message.
//!
//! Partial results and term vectors send each all-ones container as its key
//! alone (`fullKeys`, [`write_compact`]); [`views`] reads those keys as
//! containers of a shared all-ones buffer, so a union or an intersection
//! takes them like any other dense container, without a copy. A nearly-full
//! container (at most [`HOLES_MAX`] zero bits) travels as the positions of
//! its zeros (`holeKeys`); [`read_partial`] expands it back into words,
//! within a [`HoleBudget`] per message.

use std::borrow::Cow;

use bitfold_engine::fold::{
    IntersectionPlan, KeptWords, PlannedPart, Term, UnionPlan, Unread, filled_parts,
};
use bitfold_engine::kernels;
use bitfold_engine::{CONTAINER_WORDS, ContainerRef, MalformedPart, PART_MAX_DENSE, VectorPart};
use bytemuck::Pod;

use capnp::struct_list;

use crate::bitfold_capnp::{change, part, vid_vector};
use crate::net::MAX_MESSAGE_WORDS;

const _: () = assert!(
    cfg!(target_endian = "little"),
    "bitfold's wire format is little-endian and read in place"
);

/// The list of parts a vector travels as.
pub(crate) type PartList<'a> = capnp::struct_list::Reader<'a, part::Owned>;

/// A part as read from a message: borrowed when the buffer is aligned.
pub(crate) struct WirePart<'a> {
    dense_keys: Cow<'a, [u16]>,
    dense_words: Cow<'a, [u64]>,
    sparse_keys: Cow<'a, [u16]>,
    sparse_ends: Cow<'a, [u32]>,
    sparse_values: Cow<'a, [u16]>,
    full_keys: Cow<'a, [u16]>,
    hole_keys: Cow<'a, [u16]>,
    hole_ends: Cow<'a, [u32]>,
    hole_values: Cow<'a, [u16]>,
    /// The nearly-full containers' words, all ones but for their holes.
    hole_words: Vec<u64>,
}

impl<'a> WirePart<'a> {
    /// Reads the six fields of `reader`.
    pub(crate) fn read(reader: part::Reader<'a>) -> capnp::Result<WirePart<'a>> {
        let part = WirePart {
            dense_keys: cast(reader.get_dense_keys()?, "denseKeys")?,
            dense_words: cast(reader.get_dense_words()?, "denseWords")?,
            sparse_keys: cast(reader.get_sparse_keys()?, "sparseKeys")?,
            sparse_ends: cast(reader.get_sparse_ends()?, "sparseEnds")?,
            sparse_values: cast(reader.get_sparse_values()?, "sparseValues")?,
            full_keys: cast(reader.get_full_keys()?, "fullKeys")?,
            hole_keys: cast(reader.get_hole_keys()?, "holeKeys")?,
            hole_ends: cast(reader.get_hole_ends()?, "holeEnds")?,
            hole_values: cast(reader.get_hole_values()?, "holeValues")?,
            hole_words: Vec::new(),
        };
        let holes = !part.hole_ends.is_empty() || !part.hole_values.is_empty();
        if part.hole_keys.is_empty() && holes {
            return Err(failed(MalformedPart(
                "hole ends or holes without hole keys".into(),
            )));
        }
        Ok(part)
    }

    /// Fills in the words of this part's nearly-full containers, taking
    /// them from `budget`.
    fn expand_holes(&mut self, budget: &mut HoleBudget) -> Result<(), MalformedPart> {
        let words = self.hole_keys.len() * CONTAINER_WORDS;
        if words > budget.words {
            return Err(MalformedPart(format!(
                "more than {} nearly-full containers (hole keys) in one message",
                MAX_MESSAGE_WORDS / CONTAINER_WORDS
            )));
        }
        budget.words -= words;
        self.hole_words = holey_words(&self.hole_keys, &self.hole_ends, &self.hole_values)?;
        Ok(())
    }

    /// The validated view of this part, which must not have full keys (a
    /// stored vector or an import has none; [`views`] reads a partial
    /// result's).
    pub(crate) fn view(&self) -> Result<VectorPart<'_>, MalformedPart> {
        if !self.full_keys.is_empty() {
            return Err(MalformedPart(
                "a part with full keys (fullKeys), which only partial results and term vectors carry"
                    .into(),
            ));
        }
        if !self.hole_keys.is_empty() {
            return Err(MalformedPart(HOLES_ONLY_IN_PARTIALS.into()));
        }
        VectorPart::new(
            &self.dense_keys,
            &self.dense_words,
            &self.sparse_keys,
            &self.sparse_ends,
            &self.sparse_values,
        )
    }

    /// Refuses this part, one with `kind` keys, if it holds containers of
    /// another kind too: stored ones (dense or sparse), full or nearly full.
    fn holds_one_kind(&self, kind: &str) -> Result<(), MalformedPart> {
        let stored = [
            self.dense_keys.len(),
            self.dense_words.len(),
            self.sparse_keys.len(),
            self.sparse_ends.len(),
            self.sparse_values.len(),
        ];
        let kinds = [
            stored.iter().any(|&len| len > 0),
            !self.full_keys.is_empty(),
            !self.hole_keys.is_empty(),
        ];
        if kinds.iter().filter(|&&present| present).count() > 1 {
            return Err(MalformedPart(format!(
                "a part with {kind} keys holds other containers too"
            )));
        }
        Ok(())
    }

    /// Appends the views of this part's full keys: one per run of
    /// consecutive keys (at most [`FULL_RUN`] each), over all-ones words.
    fn push_full_views<'p>(&'p self, views: &mut Vec<VectorPart<'p>>) -> Result<(), MalformedPart> {
        self.holds_one_kind("full")?;
        let keys: &'p [u16] = &self.full_keys;
        if keys.windows(2).any(|w| w[0] >= w[1]) {
            return Err(MalformedPart("full keys are not strictly ascending".into()));
        }
        let runs = keys.chunk_by(|a, b| u32::from(*a) + 1 == u32::from(*b));
        for run in runs.flat_map(|run| run.chunks(FULL_RUN)) {
            let words = &FULL_WORDS[..run.len() * CONTAINER_WORDS];
            views.push(VectorPart::new(run, words, &[], &[], &[])?);
        }
        Ok(())
    }

    /// Appends the views of this part's nearly-full containers.
    fn push_hole_views<'p>(&'p self, views: &mut Vec<VectorPart<'p>>) -> Result<(), MalformedPart> {
        self.holds_one_kind("hole")?;
        let words = self.hole_words.chunks(PART_MAX_DENSE * CONTAINER_WORDS);
        for (keys, words) in self.hole_keys.chunks(PART_MAX_DENSE).zip(words) {
            views.push(VectorPart::new(keys, words, &[], &[], &[])?);
        }
        Ok(())
    }

    /// Whether any field had to be copied (its buffer was unaligned).
    #[cfg(test)]
    fn copied(&self) -> bool {
        matches!(self.dense_words, Cow::Owned(_))
            || matches!(self.dense_keys, Cow::Owned(_))
            || matches!(self.sparse_values, Cow::Owned(_))
    }
}

fn cast<'a, T: Pod>(bytes: &'a [u8], field: &str) -> capnp::Result<Cow<'a, [T]>> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return Err(capnp::Error::failed(format!(
            "malformed vector part: {field} holds {} bytes, not a multiple of {size}",
            bytes.len()
        )));
    }
    Ok(match bytemuck::try_cast_slice(bytes) {
        Ok(values) => Cow::Borrowed(values),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
    })
}

/// A capnp error carrying `err`'s message.
pub(crate) fn failed(err: impl std::fmt::Display) -> capnp::Error {
    capnp::Error::failed(err.to_string())
}

/// Reads a list of vids sent as u64 little-endian `Data`.
pub(crate) fn vids(bytes: &[u8]) -> capnp::Result<Cow<'_, [u64]>> {
    cast(bytes, "vids")
}

/// The most parts one vector travels as (docs/protocol.md §7, Limits): a
/// part holds at least one of a vector's 65,536 containers when written by
/// bitfold; a list of empty parts costs the sender a word each and the
/// reader far more, so longer lists are refused before they are read.
pub(crate) const MAX_PARTS: u32 = 1 << 17;

/// The most vectors one import message carries (clients cut larger batches).
pub(crate) const MAX_IMPORT_VECTORS: u32 = 1 << 18;

/// The most parts in all the vectors of one import message.
pub(crate) const MAX_IMPORT_PARTS: u32 = 1 << 20;

/// The most vid spans one `delete` (DBMS to master) names.
pub(crate) const MAX_DELETE_SPANS: u32 = 1 << 16;

/// The most changes one update message (master to slave) carries: as many
/// as an import's vectors. The master sends a larger update in pieces.
pub(crate) const MAX_UPDATE_CHANGES: u32 = MAX_IMPORT_VECTORS;

/// Containers of all-ones words a run of full keys reads as: a run of more
/// consecutive full keys reads as several views.
const FULL_RUN: usize = 16;

/// The words full keys read as (128 KiB, shared by every view).
static FULL_WORDS: [u64; FULL_RUN * CONTAINER_WORDS] = [u64::MAX; FULL_RUN * CONTAINER_WORDS];

/// The most full keys one vector carries, in all its parts: one per key.
pub(crate) const MAX_FULL_KEYS: usize = 1 << 16;

/// A union's output this large (32 MiB of dense words) is written in place
/// by [`write_compact`], without looking for full containers: finding them
/// needs a copy of the output first.
const COMPACT_MAX_WORDS: usize = 4 << 20;

/// The most chains (terms) one query carries: a query's most terms.
pub(crate) const MAX_CHAINS: u32 = 10_000;

/// The most vids one `fetchMany` asks for (a move or refill asks in rounds).
pub(crate) const MAX_FETCH_VIDS: u32 = 1 << 16;

/// The most bytes of vectors one `fetchMany` reply holds (plus the vector
/// that reaches it): a larger `maxBytes` is cut to it.
pub(crate) const MAX_FETCH_BYTES: u64 = 64 << 20;

/// The most bytes of term vectors one `gather` reply holds, unless its
/// first term alone is more: the terms after are asked for again, so that
/// no reply nears the message bound (three terms of 2^32 bits, 512 MiB
/// each, would pass it).
pub(crate) const MAX_GATHER_BYTES: u64 = 64 << 20;

/// The terms one reply holds, of `sized` (each with its bytes, in order):
/// the first, and each next while the reply stays within `most`. The
/// first term that does not fit is the last one `sized` is asked for, so
/// that terms left for another reply are not made for this one.
pub(crate) fn terms_within<T>(sized: impl IntoIterator<Item = (T, u64)>, most: u64) -> Vec<T> {
    let mut total = 0u64;
    let mut held = Vec::new();
    for (term, bytes) in sized {
        total = total.saturating_add(bytes);
        if !held.is_empty() && total > most {
            break;
        }
        held.push(term);
    }
    held
}

/// Refuses a list of `len` `what`s longer than `most`, naming the bound.
pub(crate) fn at_most(len: u32, most: u32, what: &str) -> capnp::Result<()> {
    if len > most {
        return Err(capnp::Error::failed(format!(
            "{len} {what} in one message, more than the {most} allowed"
        )));
    }
    Ok(())
}

/// Refuses a list of `what` whose elements take no words, before it is
/// read. Every struct bitfold writes takes at least one; a list of empty
/// structs costs its sender nothing an element (Cap'n Proto only counts
/// each against the traversal limit, up to 2^27 of them in a message),
/// while reading one into a `Vec` keeps 16 to 72 bytes an element: a few
/// bytes could make the reader allocate gigabytes (docs/protocol.md §7,
/// Limits). Every element of a list has the first one's size.
pub(crate) fn check_sized<T>(list: struct_list::Reader<'_, T>, what: &str) -> capnp::Result<()>
where
    T: capnp::traits::OwnedStruct,
{
    // The list's step, its elements' data and pointer words, read from the
    // list pointer alone: an element's total size would walk everything
    // its pointers reach, which a message can make a DAG of (a 1 KiB input
    // took 2 s to size).
    if !list.is_empty() && capnp::raw::get_list_step_size_in_bits(list) == 0 {
        return Err(capnp::Error::failed(format!(
            "a list of {} {what} that take no words",
            list.len()
        )));
    }
    Ok(())
}

/// Refuses an import's `vectors` over its bounds before any part is read:
/// more than [`MAX_IMPORT_VECTORS`] vectors or more than
/// [`MAX_IMPORT_PARTS`] parts in all of them. A slave checks it of what it
/// is sent, and the master of what a client sends, before it sends any of
/// it on.
pub(crate) fn check_import(
    vectors: struct_list::Reader<'_, vid_vector::Owned>,
) -> capnp::Result<()> {
    at_most(vectors.len(), MAX_IMPORT_VECTORS, "vectors to import")?;
    let mut parts = 0u32;
    for vector in vectors.iter() {
        parts = parts.saturating_add(vector.get_parts()?.len());
    }
    at_most(parts, MAX_IMPORT_PARTS, "parts of vectors to import")
}

/// Refuses an update's `changes` over its bounds before any of them is
/// read or copied: more than [`MAX_UPDATE_CHANGES`] changes, more than
/// [`MAX_PARTS`] parts in one clear or replace, or more than
/// [`MAX_IMPORT_PARTS`] in all of them.
pub(crate) fn check_changes(changes: struct_list::Reader<'_, change::Owned>) -> capnp::Result<()> {
    at_most(changes.len(), MAX_UPDATE_CHANGES, "changes")?;
    let mut parts = 0u32;
    for change in changes.iter() {
        if let change::Clear(list) | change::Replace(list) = change.which()? {
            let len = list?.len();
            at_most(len, MAX_PARTS, "parts of a vector")?;
            parts = parts.saturating_add(len);
        }
    }
    at_most(parts, MAX_IMPORT_PARTS, "parts of changes")
}

/// Reads every part of a list (at most [`MAX_PARTS`]) of a vector that
/// is not a partial result or a term vector: nearly-full containers are
/// refused.
pub(crate) fn read_parts(list: PartList<'_>) -> capnp::Result<Vec<WirePart<'_>>> {
    at_most(list.len(), MAX_PARTS, "parts of a vector")?;
    list.iter()
        .map(|reader| {
            let part = WirePart::read(reader)?;
            if !part.hole_keys.is_empty() {
                return Err(failed(MalformedPart(HOLES_ONLY_IN_PARTIALS.into())));
            }
            Ok(part)
        })
        .collect()
}

/// Reads every part of a partial result or a term vector (at most
/// [`MAX_PARTS`]), expanding its nearly-full containers within `budget`.
pub(crate) fn read_partial<'a>(
    list: PartList<'a>,
    budget: &mut HoleBudget,
) -> capnp::Result<Vec<WirePart<'a>>> {
    at_most(list.len(), MAX_PARTS, "parts of a vector")?;
    let mut parts = Vec::with_capacity(list.len() as usize);
    for reader in list {
        let mut part = WirePart::read(reader)?;
        if !part.hole_keys.is_empty() {
            part.expand_holes(budget).map_err(failed)?;
        }
        parts.push(part);
    }
    Ok(parts)
}

/// What the nearly-full containers of one message may expand to: as many
/// words as the message itself could hold ([`MAX_MESSAGE_WORDS`]), so that
/// a message of a few hole positions costs no more memory than the largest
/// message of words would.
pub(crate) struct HoleBudget {
    words: usize,
}

impl HoleBudget {
    /// The budget of one message.
    pub(crate) fn per_message() -> HoleBudget {
        HoleBudget {
            words: MAX_MESSAGE_WORDS,
        }
    }
}

/// The validated views of `parts`, a vector's: a part's full keys read as
/// all-ones containers (at most [`MAX_FULL_KEYS`] in all).
pub(crate) fn views<'p>(parts: &'p [WirePart<'_>]) -> capnp::Result<Vec<VectorPart<'p>>> {
    let full: usize = parts.iter().map(|p| p.full_keys.len()).sum();
    if full > MAX_FULL_KEYS {
        return Err(capnp::Error::failed(format!(
            "malformed vector part: {full} full keys in one vector, more than the {MAX_FULL_KEYS} allowed"
        )));
    }
    let mut views = Vec::with_capacity(parts.len());
    for part in parts {
        if !part.full_keys.is_empty() {
            part.push_full_views(&mut views).map_err(failed)?;
        } else if !part.hole_keys.is_empty() {
            part.push_hole_views(&mut views).map_err(failed)?;
        } else {
            views.push(part.view().map_err(failed)?);
        }
    }
    Ok(views)
}

/// The validated views of `parts`, a stored vector's (an import's, a
/// change's, a copy's): full and hole keys, which only partial results and
/// term vectors carry, are refused.
pub(crate) fn stored_views<'p>(parts: &'p [WirePart<'_>]) -> capnp::Result<Vec<VectorPart<'p>>> {
    parts
        .iter()
        .map(|part| part.view().map_err(failed))
        .collect()
}

/// Reads term vectors as terms, refusing parts that overlap or are out of key order.
pub(crate) fn terms<'t, 'a>(parts: &'t [Vec<VectorPart<'a>>]) -> capnp::Result<Vec<Term<'t, 'a>>> {
    parts.iter().map(|p| Term::new(p).map_err(failed)).collect()
}

/// Writes the union `plan` of `inputs` into `list`, filling in place;
/// returns what the fill left unread of `inputs`.
pub(crate) fn write_union(
    mut list: capnp::struct_list::Builder<'_, part::Owned>,
    plan: &UnionPlan,
    inputs: &[VectorPart<'_>],
) -> Unread {
    let mut unread = Unread::default();
    for (i, planned) in plan.parts().iter().enumerate() {
        write_planned(list.reborrow().get(i as u32), planned, |out| {
            unread.add(&plan.fill(i, inputs, out));
        });
    }
    unread
}

/// One container of a union's output, for [`write_compact`].
#[derive(Debug, Clone, Copy)]
enum Written<'w> {
    Full,
    Holey(&'w [u64]),
    Dense(&'w [u64]),
    Sparse(&'w [u16]),
}

impl Written<'_> {
    /// Which parts may hold this container with others: full ones, nearly
    /// full ones and the rest each travel in parts of their own.
    fn class(&self) -> u8 {
        match self {
            Written::Full => 0,
            Written::Holey(_) => 1,
            Written::Dense(_) | Written::Sparse(_) => 2,
        }
    }
}

/// Writes the union `plan` of `inputs` as a partial result or a term
/// vector, into the list `init` makes for a number of parts: as
/// [`write_union`] does, but each all-ones dense container travels as its
/// key alone (`fullKeys`), in parts of their own between the others' so
/// that the parts still ascend key-disjoint. The output is filled into a
/// scratch buffer first (the number of parts is known only then), unless it
/// is over [`COMPACT_MAX_WORDS`]. Returns what the fill left unread of
/// `inputs`, and the bytes of vector written.
pub(crate) fn write_compact<'b>(
    init: impl FnOnce(u32) -> capnp::struct_list::Builder<'b, part::Owned>,
    plan: &UnionPlan,
    inputs: &[VectorPart<'_>],
) -> (Unread, u64) {
    let mut scratch = None;
    let mut unread = Unread::default();
    let mut containers: Vec<(u16, Written<'_>)> = Vec::new();
    if let [only] = inputs {
        // The union of one part is that part: its containers are written
        // from where they are, each read once, with no fill into a scratch.
        containers.extend(only.containers().map(written));
    } else {
        let total: usize = plan.parts().iter().map(PlannedPart::dense_word_count).sum();
        if total > COMPACT_MAX_WORDS {
            let unread = write_union(init(plan.parts().len() as u32), plan, inputs);
            return (unread, crate::hop::planned_bytes(plan.parts()));
        }
        let words = scratch.insert(KeptWords::take());
        unread = plan.fill_all(inputs, words);
        for part in filled_parts(plan.parts(), words) {
            containers.extend(part.containers().map(written));
        }
    }
    let mut groups: Vec<&[(u16, Written<'_>)]> = Vec::new();
    for run in containers.chunk_by(|a, b| a.1.class() == b.1.class()) {
        let (mut start, mut dense) = (0, 0);
        for (i, (_, written)) in run.iter().enumerate() {
            if let Written::Dense(_) | Written::Holey(_) = written {
                if dense == PART_MAX_DENSE {
                    groups.push(&run[start..i]);
                    (start, dense) = (i, 0);
                }
                dense += 1;
            }
        }
        groups.push(&run[start..]);
    }
    if groups.is_empty() {
        groups.push(&[]);
    }
    let mut list = init(groups.len() as u32);
    let mut bytes = 0;
    for (i, group) in groups.iter().enumerate() {
        bytes += write_containers(list.reborrow().get(i as u32), group);
    }
    (unread, bytes)
}

/// How [`write_compact`] writes a container: an all-ones dense one as its key.
fn written((key, container): (u16, ContainerRef<'_>)) -> (u16, Written<'_>) {
    let written = match container {
        ContainerRef::Dense(w) if kernels::all_ones(w) => Written::Full,
        ContainerRef::Dense(w) if has_few_holes(w) => Written::Holey(w),
        ContainerRef::Dense(w) => Written::Dense(w),
        ContainerRef::Sparse(values) => Written::Sparse(values),
    };
    (key, written)
}

/// The most zero bits a dense container of a partial result or a term
/// vector may have to travel as their positions (`holeKeys`) rather than
/// as its words: 512 bytes of positions against 8 KiB of words.
const HOLES_MAX: usize = 256;

/// Why a stored vector, an import or a copy may not hold hole keys.
const HOLES_ONLY_IN_PARTIALS: &str =
    "a part with hole keys (holeKeys), which only partial results and term vectors carry";

/// Whether `words` (a dense container) has at most [`HOLES_MAX`] zero bits;
/// counts them with the kernels' popcount, 1 KiB at a time, and stops as
/// soon as there are more.
fn has_few_holes(words: &[u64]) -> bool {
    let mut zeros = 0;
    for chunk in words.chunks(128) {
        zeros += chunk.len() as u64 * 64 - kernels::popcount(chunk);
        if zeros > HOLES_MAX as u64 {
            return false;
        }
    }
    true
}

/// The words of nearly-full containers sent as `keys`, `ends` and `holes`
/// (the positions of each one's zero bits): all ones but for those.
fn holey_words(keys: &[u16], ends: &[u32], holes: &[u16]) -> Result<Vec<u64>, MalformedPart> {
    if ends.len() != keys.len() || ends.last().map(|&end| end as usize) != Some(holes.len()) {
        return Err(MalformedPart(format!(
            "{} hole keys, {} hole ends and {} holes do not agree",
            keys.len(),
            ends.len(),
            holes.len()
        )));
    }
    let mut words = vec![u64::MAX; keys.len() * CONTAINER_WORDS];
    let mut start = 0;
    for (container, &end) in words.chunks_exact_mut(CONTAINER_WORDS).zip(ends) {
        let end = end as usize;
        let Some(positions) = holes.get(start..end).filter(|p| !p.is_empty()) else {
            return Err(MalformedPart("hole ends are not strictly ascending".into()));
        };
        if positions.windows(2).any(|w| w[0] >= w[1]) {
            return Err(MalformedPart(
                "a container's holes are not strictly ascending".into(),
            ));
        }
        for &bit in positions {
            container[usize::from(bit) / 64] &= !(1 << (bit % 64));
        }
        start = end;
    }
    Ok(words)
}

/// Appends the positions of the zero bits of `words`, ascending.
fn push_holes(words: &[u64], holes: &mut Vec<u16>) {
    for (i, &word) in words.iter().enumerate() {
        let mut zeros = !word;
        while zeros != 0 {
            holes.push((i * 64) as u16 + zeros.trailing_zeros() as u16);
            zeros &= zeros - 1;
        }
    }
}

/// Writes `containers` (ascending keys, at most [`PART_MAX_DENSE`] dense)
/// as one part; returns its bytes of vector (words, keys, ends and values).
fn write_containers(mut builder: part::Builder<'_>, containers: &[(u16, Written<'_>)]) -> u64 {
    let (mut full, mut dense_keys) = (Vec::new(), Vec::new());
    let (mut sparse_keys, mut ends, mut values) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hole_keys, mut hole_ends, mut holes) = (Vec::new(), Vec::new(), Vec::new());
    for &(key, written) in containers {
        match written {
            Written::Full => full.push(key),
            Written::Holey(words) => {
                hole_keys.push(key);
                holes.reserve(HOLES_MAX);
                push_holes(words, &mut holes);
                hole_ends.push(holes.len() as u32);
            }
            Written::Dense(_) => dense_keys.push(key),
            Written::Sparse(positions) => {
                sparse_keys.push(key);
                values.extend_from_slice(positions);
                ends.push(values.len() as u32);
            }
        }
    }
    put(
        builder
            .reborrow()
            .init_dense_keys(data_len(dense_keys.len() * 2)),
        &dense_keys,
    );
    let out = builder
        .reborrow()
        .init_dense_words(data_len(dense_keys.len() * CONTAINER_WORDS * 8));
    let dense = containers.iter().filter_map(|(_, written)| match written {
        Written::Dense(words) => Some(words),
        _ => None,
    });
    for (words, out) in dense.zip(out.chunks_exact_mut(CONTAINER_WORDS * 8)) {
        out.copy_from_slice(bytemuck::cast_slice(words));
    }
    write_sparse(builder.reborrow(), &sparse_keys, &ends, &values);
    put(
        builder.reborrow().init_full_keys(data_len(full.len() * 2)),
        &full,
    );
    put(
        builder
            .reborrow()
            .init_hole_keys(data_len(hole_keys.len() * 2)),
        &hole_keys,
    );
    put(
        builder
            .reborrow()
            .init_hole_ends(data_len(hole_ends.len() * 4)),
        &hole_ends,
    );
    put(builder.init_hole_values(data_len(holes.len() * 2)), &holes);
    (size_of_val(&full[..])
        + size_of_val(&hole_keys[..])
        + size_of_val(&hole_ends[..])
        + size_of_val(&holes[..])
        + dense_keys.len() * (2 + CONTAINER_WORDS * 8)
        + size_of_val(&sparse_keys[..])
        + size_of_val(&ends[..])
        + size_of_val(&values[..])) as u64
}

/// Writes the intersection `plan` of `terms` into `list`, filling in place.
pub(crate) fn write_intersection(
    mut list: capnp::struct_list::Builder<'_, part::Owned>,
    plan: &IntersectionPlan,
    terms: &[Term<'_, '_>],
) {
    for (i, planned) in plan.parts().iter().enumerate() {
        write_planned(list.reborrow().get(i as u32), planned, |out| {
            plan.fill(i, terms, out)
        });
    }
}

fn data_len(bytes: usize) -> u32 {
    u32::try_from(bytes).expect("a part's field fits one Data")
}

fn put<T: Pod>(builder: capnp::data::Builder<'_>, values: &[T]) {
    builder.copy_from_slice(bytemuck::cast_slice(values));
}

/// Writes `parts` into `list` (of their number), one each, as [`write_part`].
pub(crate) fn write_parts(
    mut list: struct_list::Builder<'_, part::Owned>,
    parts: &[VectorPart<'_>],
) {
    for (i, part) in parts.iter().enumerate() {
        write_part(list.reborrow().get(i as u32), part);
    }
}

/// Writes a copy of `part` (at most [`PART_MAX_DENSE`] dense containers).
pub(crate) fn write_part(mut builder: part::Builder<'_>, part: &VectorPart<'_>) {
    let bytes = |values: usize, size: usize| data_len(values * size);
    put(
        builder
            .reborrow()
            .init_dense_keys(bytes(part.dense_keys().len(), 2)),
        part.dense_keys(),
    );
    put(
        builder
            .reborrow()
            .init_dense_words(bytes(part.dense_words().len(), 8)),
        part.dense_words(),
    );
    write_sparse(
        builder,
        part.sparse_keys(),
        part.sparse_ends(),
        part.sparse_values(),
    );
}

fn write_sparse(mut builder: part::Builder<'_>, keys: &[u16], ends: &[u32], values: &[u16]) {
    put(
        builder
            .reborrow()
            .init_sparse_keys(data_len(keys.len() * 2)),
        keys,
    );
    put(
        builder
            .reborrow()
            .init_sparse_ends(data_len(ends.len() * 4)),
        ends,
    );
    put(
        builder.init_sparse_values(data_len(values.len() * 2)),
        values,
    );
}

/// Writes the planned part `planned`, its dense words filled in place by `fill`.
pub(crate) fn write_planned(
    mut builder: part::Builder<'_>,
    planned: &PlannedPart,
    fill: impl FnOnce(&mut [u64]),
) {
    put(
        builder
            .reborrow()
            .init_dense_keys(data_len(planned.dense_keys().len() * 2)),
        planned.dense_keys(),
    );
    let bytes = builder
        .reborrow()
        .init_dense_words(data_len(planned.dense_word_count() * 8));
    match bytemuck::try_cast_slice_mut::<u8, u64>(&mut *bytes) {
        Ok(words) => fill(words),
        Err(_) => {
            let mut scratch = vec![0u64; planned.dense_word_count()];
            fill(&mut scratch);
            bytes.copy_from_slice(bytemuck::cast_slice(&scratch));
        }
    }
    write_sparse(
        builder,
        planned.sparse_keys(),
        planned.sparse_ends(),
        planned.sparse_values(),
    );
}

/// Cuts `part` into pieces that each fit a wire `Part`: its dense containers
/// in runs of at most [`PART_MAX_DENSE`], and its sparse containers. The
/// pieces' union is `part` (they are a bag for an OR, not a term).
pub(crate) fn pieces<'a>(part: &VectorPart<'a>) -> Vec<VectorPart<'a>> {
    if part.dense_keys().len() <= PART_MAX_DENSE {
        return vec![*part];
    }
    let words_per = PART_MAX_DENSE * bitfold_engine::CONTAINER_WORDS;
    let mut pieces: Vec<VectorPart<'a>> = part
        .dense_keys()
        .chunks(PART_MAX_DENSE)
        .zip(part.dense_words().chunks(words_per))
        .map(|(keys, words)| {
            VectorPart::new(keys, words, &[], &[], &[]).expect("a run of a valid part is valid")
        })
        .collect();
    if !part.sparse_keys().is_empty() {
        pieces.push(
            VectorPart::new(
                &[],
                &[],
                part.sparse_keys(),
                part.sparse_ends(),
                part.sparse_values(),
            )
            .expect("the sparse containers of a valid part are valid"),
        );
    }
    pieces
}

/// A message of 24 bytes whose root is a list of `count` structs that take
/// no words: what a peer could send to make a reader allocate for each.
#[cfg(test)]
pub(crate) fn empty_structs(count: u64) -> capnp::message::Reader<capnp::serialize::OwnedSegments> {
    let mut bytes = Vec::new();
    for word in [2 << 32, 1 | 7 << 32, count << 2] {
        bytes.extend(u64::to_le_bytes(word));
    }
    capnp::serialize::read_message(&bytes[..], crate::net::reader_options())
        .expect("a list of empty structs reads")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_engine::VectorBuf;
    use std::collections::BTreeSet;

    /// The refusal of `changes` (the root of `message`) by [`check_changes`].
    fn refusal(message: &capnp::message::Reader<impl capnp::message::ReaderSegments>) -> String {
        let changes: struct_list::Reader<'_, change::Owned> = message.get_root().unwrap();
        check_changes(changes).unwrap_err().to_string()
    }

    #[test]
    fn an_update_over_its_bounds_is_refused_before_it_is_read() {
        // 24 bytes: a list of 2^27 - 16 changes of no words each, which a
        // slave once copied and expanded into 19 GB before applying.
        let count: u64 = (1 << 27) - 16;
        let amplified = empty_structs(count);
        assert!(refusal(&amplified).contains(&format!(
            "{count} changes in one message, more than the 262144 allowed"
        )));
        let mut over = capnp::message::Builder::new_default();
        over.initn_root::<struct_list::Builder<'_, change::Owned>>(MAX_UPDATE_CHANGES + 1);
        assert!(refusal(&over.into_reader()).contains("262145 changes in one message"));
        // Eight clears of the most parts, and one more part.
        let mut parts = capnp::message::Builder::new_default();
        let mut list = parts.initn_root::<struct_list::Builder<'_, change::Owned>>(9);
        for i in 0..9 {
            list.reborrow()
                .get(i)
                .init_clear(if i == 8 { 1 } else { MAX_PARTS });
        }
        assert!(
            refusal(&parts.into_reader())
                .contains("1048577 parts of changes in one message, more than the 1048576")
        );
        let mut one = capnp::message::Builder::new_default();
        let mut list = one.initn_root::<struct_list::Builder<'_, change::Owned>>(2);
        list.reborrow().get(0).set_delete(());
        list.reborrow().get(1).init_replace(MAX_PARTS + 1);
        assert!(refusal(&one.into_reader()).contains("131073 parts of a vector in one message"));
        let mut within = capnp::message::Builder::new_default();
        let mut list = within.initn_root::<struct_list::Builder<'_, change::Owned>>(8);
        for i in 0..8 {
            list.reborrow().get(i).init_clear(MAX_PARTS);
        }
        check_changes(within.get_root_as_reader().unwrap()).unwrap();
    }

    #[test]
    fn a_gather_reply_holds_the_terms_that_fit_and_at_least_one() {
        let held = |bytes: &[u64], most| terms_within(bytes.iter().map(|&b| (b, b)), most);
        assert_eq!(held(&[10, 20, 30], 60), [10, 20, 30]);
        assert_eq!(held(&[10, 20, 30], 59), [10, 20]);
        assert_eq!(held(&[10, 20, 30], 30), [10, 20]);
        assert_eq!(held(&[100, 1, 1], 60), [100]);
        assert_eq!(held(&[u64::MAX, u64::MAX], 60), [u64::MAX]);
        assert_eq!(held(&[], 60), [0u64; 0]);
        // The terms after the first that does not fit are never made.
        let made = std::cell::Cell::new(0);
        let sized = [10, 20, 30, 40].into_iter().map(|b| {
            made.set(made.get() + 1);
            (b, b)
        });
        assert_eq!(terms_within(sized, 25), [10]);
        assert_eq!(made.get(), 2);
    }

    #[test]
    fn a_list_of_structs_that_take_no_words_is_refused_and_others_are_not() {
        let empty = empty_structs(1 << 26);
        let parts: PartList<'_> = empty.get_root().unwrap();
        let refused = check_sized(parts, "parts").unwrap_err().to_string();
        assert!(
            refused.contains("a list of 67108864 parts that take no words"),
            "{refused}"
        );
        let none = empty_structs(0);
        check_sized(none.get_root::<PartList<'_>>().unwrap(), "parts").unwrap();
        // A part with nothing set still takes its nine pointers' words.
        let mut blank = capnp::message::Builder::new_default();
        blank.initn_root::<struct_list::Builder<'_, part::Owned>>(3);
        check_sized::<part::Owned>(blank.get_root_as_reader().unwrap(), "parts").unwrap();
    }

    fn round_trip(part: &VectorPart<'_>) -> Vec<u32> {
        let mut message = capnp::message::Builder::new_default();
        write_part(message.init_root::<part::Builder>(), part);
        let reader = message.get_root_as_reader::<part::Reader>().unwrap();
        let wire = WirePart::read(reader).unwrap();
        assert!(!wire.copied(), "an aligned message is read in place");
        wire.view().unwrap().bits().collect()
    }

    #[test]
    fn parts_round_trip_in_place() {
        let bits: Vec<u32> = (0..3000).chain([1 << 20, u32::MAX]).collect();
        let buf = VectorBuf::from_sorted_bits(&bits);
        assert!(!buf.as_part().dense_keys().is_empty());
        assert_eq!(round_trip(&buf.as_part()), bits);
        assert_eq!(round_trip(&VectorPart::EMPTY), Vec::<u32>::new());
    }

    #[test]
    fn planned_folds_fill_the_message() {
        let a = VectorBuf::from_bits((0..2000).map(|i| i * 7).collect());
        let b = VectorBuf::from_bits(vec![3, 1 << 30]);
        let inputs = [a.as_part(), b.as_part()];
        let plan = UnionPlan::new(&inputs);
        let mut message = capnp::message::Builder::new_default();
        let mut list = message
            .initn_root::<capnp::struct_list::Builder<part::Owned>>(plan.parts().len() as u32);
        for (i, planned) in plan.parts().iter().enumerate() {
            write_planned(list.reborrow().get(i as u32), planned, |out| {
                plan.fill(i, &inputs, out);
            });
        }
        let reader = message.get_root_as_reader::<PartList>().unwrap();
        let parts = read_parts(reader).unwrap();
        let got: Vec<u32> = views(&parts)
            .unwrap()
            .iter()
            .flat_map(|p| p.bits())
            .collect();
        let mut want: Vec<u32> = (0..2000).map(|i| i * 7).chain([3, 1 << 30]).collect();
        want.sort_unstable();
        want.dedup();
        assert_eq!(got, want);
    }

    /// A one-part list `build` writes, read back as views; the error if refused.
    fn read_built(build: impl FnOnce(part::Builder<'_>)) -> Result<usize, String> {
        let mut message = capnp::message::Builder::new_default();
        build(
            message
                .initn_root::<capnp::struct_list::Builder<part::Owned>>(1)
                .get(0),
        );
        let parts = read_parts(message.get_root_as_reader().unwrap()).unwrap();
        views(&parts).map(|v| v.len()).map_err(|e| e.to_string())
    }

    #[test]
    fn full_containers_travel_as_keys_in_parts_of_their_own() {
        // Keys 0, 2, 3 and 5 full; 1 dense but not full; 4 sparse.
        let full: Vec<u32> = [0u32, 2, 3, 5]
            .iter()
            .flat_map(|&k| (k << 16)..((k + 1) << 16))
            .collect();
        let a = VectorBuf::from_sorted_bits(&full);
        let b = VectorBuf::from_bits(
            (0..3000)
                .map(|i| (1 << 16) + i * 3)
                .chain([(4 << 16) + 9, 7])
                .collect(),
        );
        let want: BTreeSet<u32> = a.as_part().bits().chain(b.as_part().bits()).collect();
        // Their union written from two parts (filled into the scratch), and
        // the same vector as one part (written from where it is).
        let one = VectorBuf::from_sorted_bits(&want.iter().copied().collect::<Vec<u32>>());
        for inputs in [&[b.as_part(), a.as_part()][..], &[one.as_part()]] {
            let plan = UnionPlan::new(inputs);
            let mut message = capnp::message::Builder::new_default();
            let (_, bytes) = write_compact(|n| message.initn_root(n), &plan, inputs);
            assert_eq!(
                bytes,
                4 * 2 + (2 + 8192) + (2 + 4 + 2),
                "keys, one dense container, one sparse"
            );
            let list: PartList<'_> = message.get_root_as_reader().unwrap();
            assert_eq!(list.len(), 5, "full, dense, full, sparse, full");
            let full_keys: Vec<usize> = list
                .iter()
                .map(|p| p.get_full_keys().unwrap().len() / 2)
                .collect();
            assert_eq!(full_keys, [1, 0, 2, 0, 1]);
            let parts = read_parts(list).unwrap();
            let views = views(&parts).unwrap();
            assert!(Term::new(&views).is_ok(), "the parts still form a term");
            let got: BTreeSet<u32> = views.iter().flat_map(|p| p.bits()).collect();
            assert_eq!(got, want);
            assert!(
                parts[0].view().is_err(),
                "an import may not carry full keys"
            );
        }
    }

    /// Container `key` of 2^16 bits with exactly the bits at `zeros` clear.
    fn all_but(key: u32, zeros: &[u32]) -> Vec<u32> {
        let zeros: BTreeSet<u32> = zeros.iter().copied().collect();
        ((key << 16)..((key + 1) << 16))
            .filter(|bit| !zeros.contains(&(bit & 0xffff)))
            .collect()
    }

    /// `inputs`' union written as a partial result, and the list it became.
    fn compact_message(
        inputs: &[VectorPart<'_>],
    ) -> (capnp::message::Builder<capnp::message::HeapAllocator>, u64) {
        let plan = UnionPlan::new(inputs);
        let mut message = capnp::message::Builder::new_default();
        let (_, bytes) = write_compact(|n| message.initn_root(n), &plan, inputs);
        (message, bytes)
    }

    #[test]
    fn nearly_full_containers_travel_as_their_holes() {
        // Key 0 full; 1 missing 3 bits; 2 missing 300 (dense); 3 missing
        // 256 (the most that travel as holes); 4 sparse.
        let few = [0, 77, 65_535];
        let many: Vec<u32> = (0..300).map(|i| i * 211).collect();
        let most: Vec<u32> = (0..256).map(|i| i * 255 + 1).collect();
        let mut bits: Vec<u32> = all_but(0, &[]);
        bits.extend(all_but(1, &few));
        bits.extend(all_but(2, &many));
        bits.extend(all_but(3, &most));
        bits.extend([(4 << 16) + 5, (4 << 16) + 9]);
        let want: BTreeSet<u32> = bits.iter().copied().collect();
        let one = VectorBuf::from_sorted_bits(&bits);
        let (message, bytes) = compact_message(&[one.as_part()]);
        assert_eq!(
            bytes,
            2 + (2 + 8192) + 2 * 2 + 2 * 4 + (3 + 256) * 2 + (2 + 4 + 4),
            "a full key, one dense container, two holey, one sparse"
        );
        let list: PartList<'_> = message.get_root_as_reader().unwrap();
        let holes: Vec<usize> = list
            .iter()
            .map(|p| p.get_hole_values().unwrap().len() / 2)
            .collect();
        assert_eq!(
            holes,
            [0, 3, 0, 256, 0],
            "full, holey, dense, holey, sparse"
        );
        let parts = read_partial(list, &mut HoleBudget::per_message()).unwrap();
        let views = views(&parts).unwrap();
        assert!(Term::new(&views).is_ok(), "the parts still form a term");
        let got: BTreeSet<u32> = views.iter().flat_map(|p| p.bits()).collect();
        assert_eq!(got, want);
        let err = read_parts(list).err().unwrap().to_string();
        assert!(
            err.contains("only partial results and term vectors carry"),
            "{err}"
        );
        assert!(
            parts[1].view().is_err(),
            "an import may not carry hole keys"
        );
    }

    /// A one-part partial result `build` writes, read back as views; the
    /// error if refused.
    fn read_partial_built(
        budget: &mut HoleBudget,
        build: impl FnOnce(part::Builder<'_>),
    ) -> Result<Vec<u32>, String> {
        let mut message = capnp::message::Builder::new_default();
        build(
            message
                .initn_root::<capnp::struct_list::Builder<part::Owned>>(1)
                .get(0),
        );
        let parts = read_partial(message.get_root_as_reader().unwrap(), budget)
            .map_err(|e| e.to_string())?;
        let views = views(&parts).map_err(|e| e.to_string())?;
        Ok(views.iter().flat_map(|p| p.bits()).collect())
    }

    #[test]
    fn malformed_holes_are_refused() {
        fn bytes<T: Pod>(values: &[T]) -> Vec<u8> {
            bytemuck::cast_slice::<T, u8>(values).to_vec()
        }
        let holes = |keys: &[u16], ends: &[u32], values: &[u16]| {
            let (keys, ends, values) = (bytes(keys), bytes(ends), bytes(values));
            move |mut p: part::Builder<'_>| {
                p.set_hole_keys(&keys);
                p.set_hole_ends(&ends);
                p.set_hole_values(&values);
            }
        };
        let budget = &mut HoleBudget::per_message();
        let got = read_partial_built(budget, holes(&[2, 5], &[1, 3], &[9, 0, 65_535])).unwrap();
        let mut want = all_but(2, &[9]);
        want.extend(all_but(5, &[0, 65_535]));
        assert_eq!(got, want);
        let refused = [
            (holes(&[2, 5], &[1], &[9, 0]), "do not agree"),
            (holes(&[2], &[1], &[9, 0]), "do not agree"),
            (
                holes(&[2, 5], &[1, 1], &[9]),
                "hole ends are not strictly ascending",
            ),
            (
                holes(&[2, 5, 7], &[2, 1, 3], &[9, 10, 11]),
                "hole ends are not strictly ascending",
            ),
            (
                holes(&[2], &[2], &[9, 9]),
                "holes are not strictly ascending",
            ),
            (holes(&[5, 2], &[1, 2], &[9, 10]), "ascend"),
            (holes(&[], &[1], &[9]), "without hole keys"),
        ];
        for (build, want) in refused {
            let err = read_partial_built(budget, build).unwrap_err();
            assert!(err.contains(want), "{err} (expected: {want})");
        }
        let err = read_partial_built(budget, |mut p| {
            holes(&[2], &[1], &[9])(p.reborrow());
            p.set_sparse_keys(&bytes(&[4u16]));
        })
        .unwrap_err();
        assert!(err.contains("holds other containers too"), "{err}");
        // A message may expand to as many words as it could hold, no more.
        let mut budget = HoleBudget {
            words: 2 * CONTAINER_WORDS,
        };
        assert!(read_partial_built(&mut budget, holes(&[1, 2], &[1, 2], &[3, 4])).is_ok());
        let err = read_partial_built(&mut budget, holes(&[3], &[1], &[3])).unwrap_err();
        assert!(
            err.contains("nearly-full containers (hole keys) in one message"),
            "{err}"
        );
    }

    proptest::proptest! {
        /// A union written as a partial result reads back as the union of
        /// its inputs' bits, whichever way each container travels.
        #[test]
        fn partial_results_read_back_as_the_union(
            containers in proptest::collection::vec(
                (0u32..6, 0usize..4, proptest::collection::vec(0u32..65_536, 0..300)),
                1..6,
            )
        ) {
            // Per container: a key, then all ones but `bits` (kind 0), those
            // bits alone (1), both in two inputs (2), or nothing but full (3).
            let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
            for (key, kind, bits) in &containers {
                match kind {
                    0 => a.extend(all_but(*key, bits)),
                    1 => a.extend(bits.iter().map(|bit| (key << 16) | bit)),
                    2 => {
                        a.extend(all_but(*key, bits));
                        b.extend(bits.iter().map(|bit| (key << 16) | bit));
                    }
                    _ => b.extend(all_but(*key, &[])),
                }
            }
            let want: BTreeSet<u32> = a.union(&b).copied().collect();
            let (a, b) = (
                VectorBuf::from_sorted_bits(&a.into_iter().collect::<Vec<_>>()),
                VectorBuf::from_sorted_bits(&b.into_iter().collect::<Vec<_>>()),
            );
            for inputs in [&[a.as_part(), b.as_part()][..], &[a.as_part()]] {
                let (message, _) = compact_message(inputs);
                let parts = read_partial(message.get_root_as_reader().unwrap(), &mut HoleBudget::per_message()).unwrap();
                let views = views(&parts).unwrap();
                proptest::prop_assert!(Term::new(&views).is_ok());
                let got: BTreeSet<u32> = views.iter().flat_map(|p| p.bits()).collect();
                let expected: BTreeSet<u32> = if inputs.len() == 2 {
                    want.clone()
                } else {
                    inputs[0].bits().collect()
                };
                proptest::prop_assert_eq!(got, expected);
            }
        }
    }

    #[test]
    fn a_union_written_after_another_holds_none_of_its_bits() {
        // The first leaves the thread's scratch all ones; the second, over
        // the same keys, must overwrite every word of it.
        let written = |inputs: &[VectorPart<'_>]| {
            let plan = UnionPlan::new(inputs);
            let mut message = capnp::message::Builder::new_default();
            write_compact(|n| message.initn_root(n), &plan, inputs);
            let parts = read_parts(message.get_root_as_reader().unwrap()).unwrap();
            let views = views(&parts).unwrap();
            views
                .iter()
                .flat_map(|p| p.bits())
                .collect::<BTreeSet<u32>>()
        };
        let full = VectorBuf::from_sorted_bits(&(0..3 << 16).collect::<Vec<u32>>());
        let half = VectorBuf::from_bits((0..3 << 16).step_by(2).collect());
        assert_eq!(written(&[full.as_part(), half.as_part()]).len(), 3 << 16);
        let quarter = VectorBuf::from_bits((0..3 << 16).step_by(4).collect());
        let want: BTreeSet<u32> = (0..3 << 16).step_by(2).collect();
        assert_eq!(written(&[half.as_part(), quarter.as_part()]), want);
    }

    #[test]
    fn malformed_full_keys_are_refused() {
        let keys = |keys: &[u16]| bytemuck::cast_slice::<u16, u8>(keys).to_vec();
        assert_eq!(
            read_built(|mut p| p.set_full_keys(&keys(&[1, 2, 3, 9]))),
            Ok(2)
        );
        let err = read_built(|mut p| p.set_full_keys(&keys(&[3, 2]))).unwrap_err();
        assert!(
            err.contains("full keys are not strictly ascending"),
            "{err}"
        );
        let err = read_built(|mut p| {
            p.set_full_keys(&keys(&[3]));
            p.set_sparse_keys(&keys(&[4]));
        })
        .unwrap_err();
        assert!(err.contains("holds other containers too"), "{err}");
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let mut message = capnp::message::Builder::new_default();
        {
            let mut list = message.initn_root::<capnp::struct_list::Builder<part::Owned>>(2);
            list.reborrow().get(0).set_full_keys(&keys(&all));
            list.get(1).set_full_keys(&keys(&all[..1]));
        }
        let parts = read_parts(message.get_root_as_reader().unwrap()).unwrap();
        let err = views(&parts).err().unwrap().to_string();
        assert!(
            err.contains("65537 full keys in one vector, more than the 65536"),
            "{err}"
        );
        assert_eq!(views(&parts[..1]).unwrap().len(), 65_536 / FULL_RUN);
    }

    #[test]
    fn malformed_parts_are_refused() {
        let mut message = capnp::message::Builder::new_default();
        {
            let mut part = message.init_root::<part::Builder>();
            part.set_dense_keys(&[1, 0, 2]);
        }
        let reader = message.get_root_as_reader::<part::Reader>().unwrap();
        assert!(WirePart::read(reader).is_err());
        let mut message = capnp::message::Builder::new_default();
        {
            let mut part = message.init_root::<part::Builder>();
            part.set_dense_keys(&[1, 0]);
        }
        let reader = message.get_root_as_reader::<part::Reader>().unwrap();
        let wire = WirePart::read(reader).unwrap();
        assert!(wire.view().is_err(), "a dense key without its words");
    }

    #[test]
    fn a_vector_of_too_many_parts_is_refused_before_it_is_read() {
        let list_of = |parts: u32| {
            let mut message = capnp::message::Builder::new_default();
            message.initn_root::<capnp::struct_list::Builder<part::Owned>>(parts);
            message
        };
        let most = list_of(MAX_PARTS);
        let parts = read_parts(most.get_root_as_reader().unwrap()).unwrap();
        assert_eq!(parts.len(), MAX_PARTS as usize);
        let over = list_of(MAX_PARTS + 1);
        let err = read_parts(over.get_root_as_reader().unwrap())
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .contains("131073 parts of a vector in one message, more than the 131072"),
            "{err}"
        );
    }

    #[test]
    fn unaligned_fields_are_copied() {
        let values: Vec<u8> = (0..9u8).collect();
        let unaligned: Cow<'_, [u16]> = cast(&values[1..], "sparseValues").unwrap();
        assert_eq!(unaligned[0], u16::from_le_bytes([1, 2]));
    }

    #[test]
    fn big_parts_are_cut_into_pieces() {
        let full = VectorBuf::from_sorted_bits(
            &(0..(PART_MAX_DENSE as u32 + 2) << 16)
                .step_by(64)
                .chain([u32::MAX])
                .collect::<Vec<_>>(),
        );
        let part = full.as_part();
        let pieces = pieces(&part);
        assert_eq!(pieces.len(), 3);
        assert!(
            pieces
                .iter()
                .all(|p| p.dense_keys().len() <= PART_MAX_DENSE)
        );
        let count: u64 = pieces.iter().map(|p| p.cardinality()).sum();
        assert_eq!(count, part.cardinality());
    }
}
