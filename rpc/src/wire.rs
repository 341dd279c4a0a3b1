//! Vectors on the wire: a list of `Part`s, each five little-endian `Data`
//! fields read in place.
//!
//! Reading casts each `Data` to its element type with
//! `bytemuck::try_cast_slice` (messages live in word-aligned buffers, so this
//! is zero-copy in practice; an unaligned buffer is copied) and validates
//! the part with [`VectorPart::new`]. Writing either copies a part or lets a
//! planned fold fill the dense words straight into the message.

use std::borrow::Cow;

use bitfold_engine::fold::{IntersectionPlan, PlannedPart, Term, UnionPlan};
use bitfold_engine::{MalformedPart, PART_MAX_DENSE, VectorPart};
use bytemuck::Pod;

use crate::bitfold_capnp::part;

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
}

impl<'a> WirePart<'a> {
    /// Reads the five fields of `reader`.
    pub(crate) fn read(reader: part::Reader<'a>) -> capnp::Result<WirePart<'a>> {
        Ok(WirePart {
            dense_keys: cast(reader.get_dense_keys()?, "denseKeys")?,
            dense_words: cast(reader.get_dense_words()?, "denseWords")?,
            sparse_keys: cast(reader.get_sparse_keys()?, "sparseKeys")?,
            sparse_ends: cast(reader.get_sparse_ends()?, "sparseEnds")?,
            sparse_values: cast(reader.get_sparse_values()?, "sparseValues")?,
        })
    }

    /// The validated view of this part.
    pub(crate) fn view(&self) -> Result<VectorPart<'_>, MalformedPart> {
        VectorPart::new(
            &self.dense_keys,
            &self.dense_words,
            &self.sparse_keys,
            &self.sparse_ends,
            &self.sparse_values,
        )
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

/// The most chains (terms) one query carries: a query's most terms.
pub(crate) const MAX_CHAINS: u32 = 10_000;

/// The most vids one `fetchMany` asks for (a move or refill asks in rounds).
pub(crate) const MAX_FETCH_VIDS: u32 = 1 << 16;

/// The most bytes of vectors one `fetchMany` reply holds (plus the vector
/// that reaches it): a larger `maxBytes` is cut to it.
pub(crate) const MAX_FETCH_BYTES: u64 = 64 << 20;

/// Refuses a list of `len` `what`s longer than `most`, naming the bound.
pub(crate) fn at_most(len: u32, most: u32, what: &str) -> capnp::Result<()> {
    if len > most {
        return Err(capnp::Error::failed(format!(
            "{len} {what} in one message, more than the {most} allowed"
        )));
    }
    Ok(())
}

/// Reads every part of a list (at most [`MAX_PARTS`]).
pub(crate) fn read_parts(list: PartList<'_>) -> capnp::Result<Vec<WirePart<'_>>> {
    at_most(list.len(), MAX_PARTS, "parts of a vector")?;
    list.iter().map(WirePart::read).collect()
}

/// The validated views of `parts`.
pub(crate) fn views<'p>(parts: &'p [WirePart<'_>]) -> capnp::Result<Vec<VectorPart<'p>>> {
    parts.iter().map(|p| p.view().map_err(failed)).collect()
}

/// Reads term vectors as terms, refusing parts that overlap or are out of key order.
pub(crate) fn terms<'t, 'a>(parts: &'t [Vec<VectorPart<'a>>]) -> capnp::Result<Vec<Term<'t, 'a>>> {
    parts.iter().map(|p| Term::new(p).map_err(failed)).collect()
}

/// Writes the union `plan` of `inputs` into `list`, filling in place.
pub(crate) fn write_union(
    mut list: capnp::struct_list::Builder<'_, part::Owned>,
    plan: &UnionPlan,
    inputs: &[VectorPart<'_>],
) {
    for (i, planned) in plan.parts().iter().enumerate() {
        write_planned(list.reborrow().get(i as u32), planned, |out| {
            plan.fill(i, inputs, out)
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_engine::VectorBuf;

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
                plan.fill(i, &inputs, out)
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
