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
//! alone (`fullKeys`, written by the servers' folds); [`views`] reads those keys as
//! containers of a shared all-ones buffer, so a union or an intersection
//! takes them like any other dense container, without a copy. A nearly-full
//! container (at most 256 zero bits) travels as the positions of
//! its zeros (`holeKeys`); [`read_partial`] expands it back into words,
//! within a [`HoleBudget`] per message.

use std::borrow::Cow;

use bitfold_engine::{CONTAINER_WORDS, MalformedPart, PART_MAX_DENSE, VectorPart};
use bytemuck::Pod;

use capnp::struct_list;

use crate::MAX_MESSAGE_WORDS;
use crate::bitfold_capnp::{change, part, vid_vector};

const _: () = assert!(
    cfg!(target_endian = "little"),
    "bitfold's wire format is little-endian and read in place"
);

/// The list of parts a vector travels as.
pub type PartList<'a> = capnp::struct_list::Reader<'a, part::Owned>;

/// A part as read from a message: borrowed when the buffer is aligned.
pub struct WirePart<'a> {
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
    pub fn read(reader: part::Reader<'a>) -> capnp::Result<WirePart<'a>> {
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
    pub fn view(&self) -> Result<VectorPart<'_>, MalformedPart> {
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
pub fn failed(err: impl std::fmt::Display) -> capnp::Error {
    capnp::Error::failed(err.to_string())
}

/// Reads a list of vids sent as u64 little-endian `Data`.
pub fn vids(bytes: &[u8]) -> capnp::Result<Cow<'_, [u64]>> {
    cast(bytes, "vids")
}

/// The most parts one vector travels as (docs/protocol.md §7, Limits): a
/// part holds at least one of a vector's 65,536 containers when written by
/// bitfold; a list of empty parts costs the sender a word each and the
/// reader far more, so longer lists are refused before they are read.
pub const MAX_PARTS: u32 = 1 << 17;

/// The most vectors one import message carries (clients cut larger batches).
pub const MAX_IMPORT_VECTORS: u32 = 1 << 18;

/// The most parts in all the vectors of one import message.
pub const MAX_IMPORT_PARTS: u32 = 1 << 20;

/// The most vid spans one `delete` (DBMS to master) names.
pub const MAX_DELETE_SPANS: u32 = 1 << 16;

/// The most changes one update message (master to slave) carries: as many
/// as an import's vectors. The master sends a larger update in pieces.
pub const MAX_UPDATE_CHANGES: u32 = MAX_IMPORT_VECTORS;

/// Containers of all-ones words a run of full keys reads as: a run of more
/// consecutive full keys reads as several views.
const FULL_RUN: usize = 16;

/// The words full keys read as (128 KiB, shared by every view).
static FULL_WORDS: [u64; FULL_RUN * CONTAINER_WORDS] = [u64::MAX; FULL_RUN * CONTAINER_WORDS];

/// The most full keys one vector carries, in all its parts: one per key.
pub const MAX_FULL_KEYS: usize = 1 << 16;

/// The most chains (terms) one query carries: a query's most terms.
pub const MAX_CHAINS: u32 = 10_000;

/// The most vids one `fetchMany` asks for (a move or refill asks in rounds).
pub const MAX_FETCH_VIDS: u32 = 1 << 16;

/// The most bytes of vectors one `fetchMany` reply holds (plus the vector
/// that reaches it): a larger `maxBytes` is cut to it.
pub const MAX_FETCH_BYTES: u64 = 64 << 20;

/// The most bytes of term vectors one `gather` reply holds, unless its
/// first term alone is more: the terms after are asked for again, so that
/// no reply nears the message bound (three terms of 2^32 bits, 512 MiB
/// each, would pass it).
pub const MAX_GATHER_BYTES: u64 = 64 << 20;

/// The terms one reply holds, of `sized` (each with its bytes, in order):
/// the first, and each next while the reply stays within `most`. The
/// first term that does not fit is the last one `sized` is asked for, so
/// that terms left for another reply are not made for this one.
pub fn terms_within<T>(sized: impl IntoIterator<Item = (T, u64)>, most: u64) -> Vec<T> {
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
pub fn at_most(len: u32, most: u32, what: &str) -> capnp::Result<()> {
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
/// bytes could make the reader allocate gigabytes (docs/slave-protocol.md
/// S9). Every element of a list has the first one's size.
pub fn check_sized<T>(list: struct_list::Reader<'_, T>, what: &str) -> capnp::Result<()>
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
pub fn check_import(vectors: struct_list::Reader<'_, vid_vector::Owned>) -> capnp::Result<()> {
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
pub fn check_changes(changes: struct_list::Reader<'_, change::Owned>) -> capnp::Result<()> {
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
pub fn read_parts(list: PartList<'_>) -> capnp::Result<Vec<WirePart<'_>>> {
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
pub fn read_partial<'a>(
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
pub struct HoleBudget {
    words: usize,
}

impl HoleBudget {
    /// The budget of one message.
    pub fn per_message() -> HoleBudget {
        HoleBudget {
            words: MAX_MESSAGE_WORDS,
        }
    }
}

/// The validated views of `parts`, a vector's: a part's full keys read as
/// all-ones containers (at most [`MAX_FULL_KEYS`] in all).
pub fn views<'p>(parts: &'p [WirePart<'_>]) -> capnp::Result<Vec<VectorPart<'p>>> {
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
pub fn stored_views<'p>(parts: &'p [WirePart<'_>]) -> capnp::Result<Vec<VectorPart<'p>>> {
    parts
        .iter()
        .map(|part| part.view().map_err(failed))
        .collect()
}

/// Why a stored vector, an import or a copy may not hold hole keys.
const HOLES_ONLY_IN_PARTIALS: &str =
    "a part with hole keys (holeKeys), which only partial results and term vectors carry";

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

/// `bytes` as the length of a `Data` field.
pub fn data_len(bytes: usize) -> u32 {
    u32::try_from(bytes).expect("a part's field fits one Data")
}

/// Copies `values` into `builder`, little-endian.
pub fn put<T: Pod>(builder: capnp::data::Builder<'_>, values: &[T]) {
    builder.copy_from_slice(bytemuck::cast_slice(values));
}

/// Writes `parts` into `list` (of their number), one each, as [`write_part`].
pub fn write_parts(mut list: struct_list::Builder<'_, part::Owned>, parts: &[VectorPart<'_>]) {
    for (i, part) in parts.iter().enumerate() {
        write_part(list.reborrow().get(i as u32), part);
    }
}

/// Writes a copy of `part` (at most [`PART_MAX_DENSE`] dense containers).
pub fn write_part(mut builder: part::Builder<'_>, part: &VectorPart<'_>) {
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

/// Writes the sparse containers `keys`, `ends` and `values` of a part.
pub fn write_sparse(mut builder: part::Builder<'_>, keys: &[u16], ends: &[u32], values: &[u16]) {
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

/// Cuts `part` into pieces that each fit a wire `Part`: its dense containers
/// in runs of at most [`PART_MAX_DENSE`], and its sparse containers. The
/// pieces' union is `part` (they are a bag for an OR, not a term).
pub fn pieces<'a>(part: &VectorPart<'a>) -> Vec<VectorPart<'a>> {
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
/// no words: what a peer could send to make a reader allocate for each
/// (for tests of the refusals).
pub fn empty_structs(count: u64) -> capnp::message::Reader<capnp::serialize::OwnedSegments> {
    let mut bytes = Vec::new();
    for word in [2 << 32, 1 | 7 << 32, count << 2] {
        bytes.extend(u64::to_le_bytes(word));
    }
    capnp::serialize::read_message(&bytes[..], crate::reader_options())
        .expect("a list of empty structs reads")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_engine::VectorBuf;

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
        // All of containers 2 and 5 but the bits their holes name.
        let mut want: Vec<u32> = ((2 << 16)..(3 << 16))
            .filter(|&bit| bit != (2 << 16) + 9)
            .collect();
        want.extend(((5 << 16)..(6 << 16)).filter(|&bit| !matches!(bit & 0xffff, 0 | 65_535)));
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
