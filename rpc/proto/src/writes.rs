//! The vectors a write carries, as the slave that stores them reads them
//! before it touches its store: an import's (`Slave.import`, `stage`), an
//! update's changes (`Slave.update`) and the copies of a `fetchMany` reply
//! (`Slave.pull`). Each is read within the bounds of one message, and its
//! parts are validated as a stored vector's: no full or hole keys, which
//! only partial results and term vectors carry.

use bitfold_engine::{ContainerRef, VectorBuf, VectorPart};

use crate::bitfold_capnp::{change, fetched_copies, vid_vector};
use crate::wire::{self, WirePart};

/// The parts of an import's vectors, each with its vid, in the order they
/// came: refused whole if over the import bounds ([`wire::check_import`])
/// or if a part's fields do not read.
pub fn read_import(
    vectors: capnp::struct_list::Reader<'_, vid_vector::Owned>,
) -> capnp::Result<Vec<(u64, WirePart<'_>)>> {
    wire::check_import(vectors)?;
    let mut wire_parts = Vec::new();
    for vector in vectors.iter() {
        let vid = vector.get_vid();
        for part in wire::read_parts(vector.get_parts()?)? {
            wire_parts.push((vid, part));
        }
    }
    Ok(wire_parts)
}

/// The validated views of an import's parts ([`read_import`]), each with
/// its vid: what the store is handed.
pub fn import_views<'p>(
    parts: &'p [(u64, WirePart<'_>)],
) -> capnp::Result<Vec<(u64, VectorPart<'p>)>> {
    let view =
        |(vid, part): &'p (u64, WirePart<'_>)| Ok((*vid, part.view().map_err(wire::failed)?));
    parts.iter().map(view).collect()
}

/// One change of an update, read from its message: its vid, what it does,
/// and the parts of a clear or a replace (none for a delete).
pub struct ChangeParts<'a> {
    vid: u64,
    kind: ChangeKind,
    parts: Vec<WirePart<'a>>,
}

/// What a change does.
#[derive(Clone, Copy)]
enum ChangeKind {
    Clear,
    Delete,
    Replace,
}

/// Reads the changes of an update: refused whole if over the bounds of one
/// update ([`wire::check_changes`]), if a change sets bits (those travel as
/// an import) or if a change's parts do not read.
pub fn read_changes(
    changes: capnp::struct_list::Reader<'_, change::Owned>,
) -> capnp::Result<Vec<ChangeParts<'_>>> {
    wire::check_changes(changes)?;
    changes
        .iter()
        .map(|change| {
            let (kind, parts) = match change.which()? {
                change::Clear(parts) => (ChangeKind::Clear, wire::read_parts(parts?)?),
                change::Delete(()) => (ChangeKind::Delete, Vec::new()),
                change::Replace(parts) => (ChangeKind::Replace, wire::read_parts(parts?)?),
                change::Set(_) => {
                    return Err(wire::failed(
                        "an update cannot set bits: the bits of an import travel as an import",
                    ));
                }
            };
            Ok(ChangeParts {
                vid: change.get_vid(),
                kind,
                parts,
            })
        })
        .collect()
}

/// What one change does to the store, validated.
pub enum ChangeView<'p> {
    /// Clear the bits of these parts from the vector.
    Clear(u64, Vec<VectorPart<'p>>),
    /// Remove the vector.
    Delete(u64),
    /// Make the vector exactly this (its parts put together).
    Replace(u64, VectorBuf),
}

/// The changes `read` ([`read_changes`]) as the store takes them: every
/// part validated, a replace's parts put together into its vector (refused
/// if they overlap).
pub fn change_views<'p>(read: &'p [ChangeParts<'_>]) -> capnp::Result<Vec<ChangeView<'p>>> {
    read.iter()
        .map(|change| {
            let views = wire::stored_views(&change.parts)?;
            Ok(match change.kind {
                ChangeKind::Clear => ChangeView::Clear(change.vid, views),
                ChangeKind::Delete => ChangeView::Delete(change.vid),
                ChangeKind::Replace => ChangeView::Replace(change.vid, concatenate(&views)?),
            })
        })
        .collect()
}

/// The vector made of `parts` (key-disjoint, in ascending key order, as
/// the parts of a vector travel).
fn concatenate(parts: &[VectorPart<'_>]) -> capnp::Result<VectorBuf> {
    let mut vector = VectorBuf::new();
    for (key, container) in parts.iter().flat_map(|p| p.containers()) {
        match container {
            ContainerRef::Dense(words) => vector.push_dense(key, words),
            ContainerRef::Sparse(values) => vector.push_sparse(key, values),
        }
        .map_err(|e| wire::failed(format!("a replaced vector's parts overlap: {e}")))?;
    }
    Ok(vector)
}

/// What a source answered a `fetchMany`, copied out of its reply so that
/// another thread can store it: each vid fetched, with its vector, or
/// `None` where the source does not hold it (deleted here).
pub struct Copies {
    /// How many of the vids asked the source answered (the first ones).
    pub answered: u32,
    /// Each vid answered, with its vector or `None`: the vectors sent in
    /// their order, then the vids missing.
    pub vectors: Vec<(u64, Option<VectorBuf>)>,
    /// Bytes of the vectors' containers as they travelled (words, keys,
    /// ends and values of every part).
    pub bytes: u64,
}

/// The copies of a `fetchMany` reply to the vids `asked`, checked as an
/// import is (bounds, parts that read as a vector) and against what was
/// asked: exactly the first `answered` vids asked, each once.
pub fn read_copies(copies: fetched_copies::Reader<'_>, asked: &[u64]) -> capnp::Result<Copies> {
    let answered = copies.get_answered();
    if answered == 0 || answered as usize > asked.len() {
        return Err(wire::failed(format!(
            "it answered {answered} of the {} vids asked",
            asked.len()
        )));
    }
    let found = copies.get_vectors()?;
    let missing = wire::vids(copies.get_missing()?)?;
    // Counted before any is read: a list of empty vectors costs its sender
    // nothing a vector, and each read one takes memory here.
    if u64::from(found.len()) + missing.len() as u64 != u64::from(answered) {
        return Err(wire::failed(format!(
            "it answered {answered} of the vids asked with {} vectors and {} missing",
            found.len(),
            missing.len()
        )));
    }
    let mut vectors = Vec::with_capacity(found.len() as usize + missing.len());
    let mut bytes = 0;
    for vector in found.iter() {
        // As an import's: no full keys, which a source never writes (its
        // copies are stored vectors) and each of which, two bytes sent,
        // would take 8 KiB here.
        let parts = wire::read_parts(vector.get_parts()?)?;
        let views = wire::stored_views(&parts)?;
        bytes += views.iter().map(VectorPart::byte_len).sum::<u64>();
        vectors.push((vector.get_vid(), Some(concatenate(&views)?)));
    }
    vectors.extend(missing.iter().map(|&vid| (vid, None)));
    // Exactly the first `answered` vids asked, each once: no copy is lost
    // and none is stored that was not asked for.
    let mut sent: Vec<u64> = vectors.iter().map(|(vid, _)| *vid).collect();
    let mut expected = asked[..answered as usize].to_vec();
    sent.sort_unstable();
    expected.sort_unstable();
    if sent != expected {
        return Err(wire::failed(format!(
            "it did not send the first {answered} vids asked, each once, as vectors or missing"
        )));
    }
    Ok(Copies {
        answered,
        vectors,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `fetchMany` reply: `answered`, the vectors `found` (vid `v` holding
    /// bit `v`), and the vids `missing`.
    fn reply(
        answered: u32,
        found: &[u64],
        missing: &[u64],
    ) -> capnp::message::Builder<capnp::message::HeapAllocator> {
        let mut message = capnp::message::Builder::new_default();
        let mut copies = message.init_root::<fetched_copies::Builder<'_>>();
        copies.set_answered(answered);
        copies.set_missing(bytemuck::cast_slice(missing));
        let mut list = copies.init_vectors(found.len() as u32);
        for (i, &vid) in found.iter().enumerate() {
            let mut vector = list.reborrow().get(i as u32);
            vector.set_vid(vid);
            let bits = VectorBuf::from_bits(vec![vid as u32]);
            wire::write_part(vector.init_parts(1).get(0), &bits.as_part());
        }
        message
    }

    fn read(
        message: &capnp::message::Builder<capnp::message::HeapAllocator>,
        asked: &[u64],
    ) -> capnp::Result<Copies> {
        read_copies(message.get_root_as_reader()?, asked)
    }

    #[test]
    fn an_honest_reply_gives_each_vid_asked_its_vector_or_a_delete() {
        let copies = read(&reply(3, &[5, 9], &[7]), &[5, 7, 9, 11]).unwrap();
        assert_eq!(copies.answered, 3);
        let got: Vec<(u64, Option<Vec<u32>>)> = copies
            .vectors
            .iter()
            .map(|(vid, v)| (*vid, v.as_ref().map(|v| v.as_part().bits().collect())))
            .collect();
        assert_eq!(got, [(5, Some(vec![5])), (9, Some(vec![9])), (7, None)]);
        // What a move reports as copied: the two vectors' containers.
        let one_bit = VectorBuf::from_bits(vec![5]).as_part().byte_len();
        assert!(one_bit > 0);
        assert_eq!(copies.bytes, 2 * one_bit);
    }

    #[test]
    fn a_reply_that_is_not_what_was_asked_is_refused() {
        let asked = [5, 7, 9, 11];
        let refused = |message| read(&message, &asked).err().map(|e| e.to_string());
        // A vid it was not asked for, one it dropped, one sent twice, none
        // answered, more answered than asked: nothing of it is stored.
        for message in [
            reply(2, &[5, 8], &[]),
            reply(3, &[5, 9], &[]),
            reply(2, &[5, 5], &[]),
            reply(2, &[5], &[7, 7]),
            reply(0, &[], &[]),
            reply(5, &[5, 7, 9, 11], &[]),
        ] {
            let err = refused(message).expect("a wrong reply was accepted");
            assert!(err.contains("vids asked"), "{err}");
        }
    }

    #[test]
    fn a_copy_with_full_keys_is_refused() {
        // 65,536 full keys, 128 KiB sent, would be 512 MiB of words here.
        let mut message = reply(1, &[5], &[]);
        let copies = message.get_root::<fetched_copies::Builder<'_>>().unwrap();
        let keys: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let mut vector = copies.get_vectors().unwrap().get(0);
        vector.set_vid(5);
        vector.init_parts(1).get(0).set_full_keys(&keys);
        let err = read(&message, &[5]).err().expect("full keys were accepted");
        assert!(err.to_string().contains("full keys"), "{err}");
    }

    #[test]
    fn a_reply_of_more_vectors_than_it_answered_is_refused_before_they_are_read() {
        // 2^26 empty vectors, which would take 2.7 GB read, for one vid.
        let empty = wire::empty_structs(1 << 26);
        let mut message = reply(1, &[], &[]);
        let mut copies = message.get_root::<fetched_copies::Builder<'_>>().unwrap();
        copies.set_vectors(empty.get_root().unwrap()).unwrap();
        let err = read(&message, &[5]).err().expect("the reply was accepted");
        assert!(
            err.to_string()
                .contains("answered 1 of the vids asked with 67108864 vectors and 0 missing"),
            "{err}"
        );
    }
}
