//! The wire codec ([`bitfold_proto::wire`], re-exported here) and, beside
//! it, what only the servers write: planned folds filled straight into a
//! message ([`write_union`], [`write_intersection`]), and partial results
//! and term vectors whose all-ones containers travel as their keys alone
//! and nearly-full ones (at most [`HOLES_MAX`] zero bits) as the positions
//! of their zeros ([`write_compact`]).

use bitfold_engine::fold::{
    IntersectionPlan, KeptWords, PlannedPart, Term, UnionPlan, Unread, filled_parts,
};
use bitfold_engine::kernels;
use bitfold_engine::{CONTAINER_WORDS, ContainerRef, PART_MAX_DENSE, VectorPart};
pub(crate) use bitfold_proto::wire::*;

use crate::bitfold_capnp::part;

/// A union's output this large (32 MiB of dense words) is written in place
/// by [`write_compact`], without looking for full containers: finding them
/// needs a copy of the output first.
const COMPACT_MAX_WORDS: usize = 4 << 20;

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
            return (unread, planned_bytes(plan.parts()));
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

/// Bytes of the vector a fold planned as `parts` writes (words, keys, ends
/// and values, as [`bitfold_engine::VectorPart::byte_len`] counts them).
pub(crate) fn planned_bytes(parts: &[PlannedPart]) -> u64 {
    parts
        .iter()
        .map(|p| {
            (p.dense_word_count() * 8
                + size_of_val(p.dense_keys())
                + size_of_val(p.sparse_keys())
                + size_of_val(p.sparse_ends())
                + size_of_val(p.sparse_values())) as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_engine::VectorBuf;
    use std::collections::BTreeSet;

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
}
