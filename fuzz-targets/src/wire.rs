use bitfold_engine::fold::{Term, UnionPlan};
use bitfold_proto::bitfold_capnp::{part, vid_vector};
use bitfold_proto::wire::{self, HoleBudget, MAX_IMPORT_PARTS, MAX_IMPORT_VECTORS};
use bitfold_proto::writes::{import_views, read_import};

use crate::message::read_message;

/// The slave's decoding of a request's vectors. The first byte picks how
/// `data` becomes a message: even, a list of vids and parts built from the
/// bytes (keys unsorted or repeated, containers overlapping, lengths that
/// disagree; 2 modulo 4, with full keys too; 4 or 6 modulo 8, with hole
/// keys too); odd, the bytes read as a
/// message as they come off the socket. The message's root is read both as
/// a list of parts (a partial result) and as a list of `VidVector`s (an
/// import): refused cleanly, or read as the bits a naive decoding of the
/// same fields gives.
pub fn wire(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode % 2 == 0 {
        build(rest, mode % 4 == 2, mode % 8 >= 4)
    } else {
        rest.to_vec()
    };
    let Ok(message) = read_message(&bytes) else {
        return;
    };
    if let Ok(list) = message.get_root::<capnp::struct_list::Reader<part::Owned>>() {
        check_vector(list);
    }
    if let Ok(vectors) = message.get_root::<capnp::struct_list::Reader<vid_vector::Owned>>() {
        check_import(vectors);
    }
}

/// A vector received as a list of parts, as a slave reads it
/// ([`wire::read_partial`], [`wire::views`]): its set bits ascending (the
/// union of its parts), and whether the parts also form a term (ascending,
/// key-disjoint: what a chain's partial result must be). Fails as the slave
/// would on a malformed part.
fn read_vector(
    list: capnp::struct_list::Reader<'_, part::Owned>,
) -> capnp::Result<(Vec<u32>, bool)> {
    let parts = wire::read_partial(list, &mut HoleBudget::per_message())?;
    let views = wire::views(&parts)?;
    let is_term = Term::new(&views).is_ok();
    let plan = UnionPlan::new(&views);
    let bits = plan
        .run(&views)
        .iter()
        .flat_map(|buf| buf.as_part().bits().collect::<Vec<_>>())
        .collect();
    Ok((bits, is_term))
}

/// A list of parts is refused, or read as the union of its naive decoding;
/// whether it was read.
pub(crate) fn check_vector(list: capnp::struct_list::Reader<'_, part::Owned>) -> bool {
    let Ok((bits, is_term)) = read_vector(list) else {
        return false;
    };
    let parts: Vec<Vec<u32>> = list.iter().map(|p| naive(p)).collect();
    let mut want: Vec<u32> = parts.iter().flatten().copied().collect();
    want.sort_unstable();
    want.dedup();
    assert!(bits == want, "read other bits");
    if is_term {
        let ranges: Vec<(u32, u32)> = parts
            .iter()
            .filter_map(|p| Some((*p.first()? >> 16, *p.last()? >> 16)))
            .collect();
        assert!(
            ranges.windows(2).all(|w| w[0].1 < w[1].0),
            "a term's parts ascend, key-disjoint"
        );
    }
    true
}

/// An import over a bound, with full or hole keys, or with a vector whose parts do
/// not read as a partial result's would, is refused; any other is read as a slave reads it
/// before it touches its store: each part, in order, with its vector's vid
/// and the bits a naive decoding of its fields gives. (No store is built:
/// what the store keeps of a batch is the engine's to test.)
fn check_import(vectors: capnp::struct_list::Reader<'_, vid_vector::Owned>) {
    let imported = import(vectors);
    if vectors.len() > MAX_IMPORT_VECTORS {
        // Refused before any vector is read, as a slave does: a few words can
        // claim millions of empty vectors, too many to check one by one.
        assert!(
            imported.is_err(),
            "an import over the vectors bound is refused"
        );
        return;
    }
    let Ok(lists) = vectors
        .iter()
        .map(|vector| vector.get_parts())
        .collect::<capnp::Result<Vec<_>>>()
    else {
        assert!(
            imported.is_err(),
            "an import whose parts do not read is refused"
        );
        return;
    };
    let parts: u64 = lists.iter().map(|list| u64::from(list.len())).sum();
    if parts > u64::from(MAX_IMPORT_PARTS) {
        assert!(
            imported.is_err(),
            "an import over the parts bound is refused"
        );
        return;
    }
    let Ok(batch) = imported else {
        // Full and hole keys are a partial result's alone: an import
        // carrying any is refused even where the same parts would read as a
        // partial result.
        let partial_only = lists.iter().flat_map(|list| list.iter()).any(|part| {
            part.get_full_keys().is_ok_and(|keys| !keys.is_empty())
                || part.get_hole_keys().is_ok_and(|keys| !keys.is_empty())
        });
        // Every list is checked as a partial result, hole keys or not.
        let read = lists.iter().filter(|&&list| check_vector(list)).count();
        assert!(
            partial_only || read < lists.len(),
            "an import whose vectors all read, without full or hole keys, is accepted"
        );
        return;
    };
    let want: Vec<(u64, Vec<u32>)> = vectors
        .iter()
        .zip(&lists)
        .flat_map(|(vector, list)| {
            list.iter().map(move |part| {
                let mut bits = naive(part);
                bits.sort_unstable();
                (vector.get_vid(), bits)
            })
        })
        .collect();
    assert!(batch == want, "the parts an import hands the store");
}

/// `Slave.import`'s reading of `vectors` ([`read_import`],
/// [`import_views`]), without a store: the request's error if it is
/// malformed, else each of its parts as the slave hands it to its store, in
/// the order they came: the part's vid and its set bits ascending. (The
/// store keeps each vid's union of its parts.)
fn import(
    vectors: capnp::struct_list::Reader<'_, vid_vector::Owned>,
) -> capnp::Result<Vec<(u64, Vec<u32>)>> {
    let parts = read_import(vectors)?;
    Ok(import_views(&parts)?
        .iter()
        .map(|(vid, part)| (*vid, part.bits().collect()))
        .collect())
}

/// The little-endian `u16`s of a field's bytes (a last odd byte left out).
pub(crate) fn u16s(bytes: &[u8]) -> Vec<u16> {
    let pairs = bytes.chunks_exact(2);
    pairs.map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
}

/// The bits of an accepted part, from its fields read byte by byte.
pub(crate) fn naive(part: part::Reader<'_>) -> Vec<u32> {
    fn field(data: capnp::Result<&[u8]>) -> &[u8] {
        data.expect("an accepted part's fields read")
    }
    let ends = |bytes: &[u8]| -> Vec<usize> {
        let quads = bytes.chunks_exact(4);
        quads
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .collect()
    };
    let dense_keys = u16s(field(part.get_dense_keys()));
    let dense_words = field(part.get_dense_words());
    let sparse_keys = u16s(field(part.get_sparse_keys()));
    let sparse_ends = ends(field(part.get_sparse_ends()));
    let sparse_values = u16s(field(part.get_sparse_values()));
    let full_keys = u16s(field(part.get_full_keys()));
    let hole_keys = u16s(field(part.get_hole_keys()));
    let hole_ends = ends(field(part.get_hole_ends()));
    let holes = u16s(field(part.get_hole_values()));
    let mut bits = Vec::new();
    for &key in &full_keys {
        bits.extend((0..1 << 16).map(|low| u32::from(key) << 16 | low));
    }
    let mut start = 0;
    for (&key, &end) in hole_keys.iter().zip(&hole_ends) {
        let mut set = vec![true; 1 << 16];
        for &zero in &holes[start..end] {
            set[usize::from(zero)] = false;
        }
        let lows = (0..1 << 16).filter(|&low| set[low as usize]);
        bits.extend(lows.map(|low| u32::from(key) << 16 | low));
        start = end;
    }
    for (i, &key) in dense_keys.iter().enumerate() {
        let words = dense_words[i * 8192..(i + 1) * 8192].chunks_exact(8);
        for (at, word) in words.enumerate() {
            let mut word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            while word != 0 {
                bits.push(u32::from(key) << 16 | (at as u32 * 64 + word.trailing_zeros()));
                word &= word - 1;
            }
        }
    }
    let mut start = 0;
    for (&key, &end) in sparse_keys.iter().zip(&sparse_ends) {
        bits.extend(
            sparse_values[start..end]
                .iter()
                .map(|&low| u32::from(key) << 16 | u32::from(low)),
        );
        start = end;
    }
    bits
}

/// Serializes a list of `VidVector`s whose shape and contents `data` gives,
/// with at most one full key per part if `full` and at most three
/// nearly-full containers if `holes`.
pub(crate) fn build(data: &[u8], full: bool, holes: bool) -> Vec<u8> {
    let mut input = Bytes(data);
    let mut message = capnp::message::Builder::new_default();
    let count = input.byte() % 5;
    let mut vectors =
        message.initn_root::<capnp::struct_list::Builder<vid_vector::Owned>>(u32::from(count));
    for i in 0..count {
        let mut vector = vectors.reborrow().get(u32::from(i));
        vector.set_vid(u64::from(input.byte() % 4));
        let parts_count = input.byte() % 4;
        let mut parts = vector.init_parts(u32::from(parts_count));
        for j in 0..parts_count {
            let mut part = parts.reborrow().get(u32::from(j));
            part.set_dense_keys(input.field(2, 8));
            let containers = usize::from(input.byte() % 4);
            let skew = usize::from(input.byte() % 3);
            let len = (containers * 8192 + skew).saturating_sub(1);
            let mut words = input.field(1, 255).to_vec();
            words.resize(len, 0);
            part.set_dense_words(&words);
            part.set_sparse_keys(input.field(2, 8));
            part.set_sparse_ends(input.field(4, 8));
            part.set_sparse_values(input.field(1, 255));
            if full {
                part.set_full_keys(input.field(2, 2));
            }
            if holes {
                part.set_hole_keys(input.field(2, 4));
                part.set_hole_ends(input.field(4, 4));
                part.set_hole_values(input.field(2, 8));
            }
        }
    }
    capnp::serialize::write_message_to_words(&message)
}

/// The fuzzer's bytes, taken front to back; zeros once they run out.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn byte(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    /// A count byte (below `most`), then that many `unit`-byte values.
    fn field(&mut self, unit: usize, most: u8) -> &'a [u8] {
        let count = usize::from(self.byte() % most);
        self.take(unit * count)
    }

    fn take(&mut self, len: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(len.min(self.0.len()));
        self.0 = rest;
        taken
    }
}
