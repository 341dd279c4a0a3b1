//! Imports: every non-empty vector is cut into its pieces, recorded in the
//! master's journal, then set on all their owners (`update`), and their
//! keys recorded in the catalog: the import is on every owner, on none, or
//! recorded and rolled forward on the owners that missed it.

use std::collections::BTreeSet;

use bitfold_engine::VectorPart;
use bitfold_engine::vector::Within;
use capnp::message::{Builder, HeapAllocator};

use super::reply::Failure;
use super::update::Kind;
use super::{Master, journal};
use crate::bitfold_capnp::{change, part, vid_vector};
use crate::pieces::Pieces;
use crate::wire::{self, WirePart};
use bitfold_proto::ErrorKind;
use capnp::struct_list;

impl Master {
    /// Records the import of every non-empty vector, has all its owners
    /// set its bits and records the vids; returns the bytes of the vectors
    /// stored.
    pub(super) async fn import_vectors(
        &self,
        vectors: capnp::struct_list::Reader<'_, vid_vector::Owned>,
    ) -> Result<u64, Failure> {
        wire::check_import(vectors).map_err(bad_query)?;
        let read = read_vectors(vectors)?;
        let views = holding_bits(&read)?;
        let pieces = self.layout().current.pieces();
        if let Some((vid, _)) = views.iter().find(|(vid, _)| *vid > pieces.max_vid()) {
            return Err(Failure::new(
                ErrorKind::BadQuery,
                format!(
                    "vector {vid} cannot be stored: this cluster cuts vectors into pieces of {} \
                     bits, so a vid is at most {} (2^48 - 1); number the vectors below it, or \
                     set piece = 4294967296 in the cluster file of a master that holds no \
                     vectors yet",
                    pieces.bits(),
                    pieces.max_vid()
                ),
            ));
        }
        let bytes = views
            .iter()
            .flat_map(|(_, parts)| parts)
            .map(VectorPart::byte_len)
            .sum();
        let (message, keys) = changes_of(&cut(pieces, &views), |change, len| change.init_set(len));
        self.apply(message, keys, Kind::Import).await?;
        Ok(bytes)
    }
}

/// Refuses a request of more `what` than `most` before reading any, as a
/// `badQuery` naming the bound (docs/protocol.md §7, Limits): a list of
/// empty structs costs its sender nothing an element, and the master's loop
/// over it a little each.
pub(super) fn within(len: u32, most: u32, what: &str) -> Result<(), Failure> {
    wire::at_most(len, most, what).map_err(bad_query)
}

/// A request refused as it was read, as a `badQuery` saying why.
fn bad_query(err: capnp::Error) -> Failure {
    Failure::new(ErrorKind::BadQuery, err.extra)
}

/// The vectors of a request (an import or a clear), each read once, in
/// place: a message's traversal limit counts every read of it, and one
/// vector of 2^32 bits takes half of it, so the master reads a vector once
/// and writes what it sends on from that reading. A malformed vector is a
/// `badQuery`: the request itself is wrong, not the master.
pub(super) fn read_vectors<'a>(
    vectors: capnp::struct_list::Reader<'a, vid_vector::Owned>,
) -> Result<Vec<(u64, Vec<WirePart<'a>>)>, Failure> {
    vectors
        .iter()
        .map(|vector| {
            let vid = vector.get_vid();
            let parts = vector.get_parts().and_then(wire::read_parts);
            Ok((vid, parts.map_err(|e| malformed(vid, e))?))
        })
        .collect()
}

/// The vectors of `read` that hold a bit, their parts checked as a slave
/// checks them (no full or hole keys), so that no slave is sent a request
/// it would refuse: the master would take that refusal for its failure.
pub(super) fn holding_bits<'p>(
    read: &'p [(u64, Vec<WirePart<'_>>)],
) -> Result<Vec<(u64, Vec<VectorPart<'p>>)>, Failure> {
    let mut holding = Vec::new();
    for (vid, parts) in read {
        let views = wire::stored_views(parts).map_err(|e| malformed(*vid, e))?;
        if views.iter().any(|p| !p.is_empty()) {
            holding.push((*vid, views));
        }
    }
    Ok(holding)
}

/// The pieces of `vectors` (vids at most [`Pieces::max_vid`]) that hold a
/// bit, each under its key ([`Pieces::key`]): its parts narrowed to the
/// piece's containers, in place.
pub(super) fn cut<'p>(
    pieces: Pieces,
    vectors: &'p [(u64, Vec<VectorPart<'p>>)],
) -> Vec<(u64, Vec<Within<'p>>)> {
    let mut cut: Vec<(u64, Vec<Within<'p>>)> = Vec::new();
    for (vid, parts) in vectors {
        for part in parts {
            let Some((first, last)) = part.key_range() else {
                continue;
            };
            for piece in pieces.spanned(first..=last) {
                let within = part.within(pieces.containers(piece));
                if within.part().is_empty() {
                    continue;
                }
                let key = pieces.key(*vid, piece);
                match cut.last_mut() {
                    Some((last, list)) if *last == key => list.push(within),
                    _ => cut.push((key, vec![within])),
                }
            }
        }
    }
    cut
}

/// A change's list of parts to write: `init_set` (an import) or
/// `init_clear`.
type InitParts = for<'a> fn(change::Builder<'a>, u32) -> struct_list::Builder<'a, part::Owned>;

/// The changes writing the pieces of `cut` (each list of parts made by
/// `init`), as a new write's message ([`journal::init_changes`]), and
/// their keys.
pub(super) fn changes_of(
    cut: &[(u64, Vec<Within<'_>>)],
    init: InitParts,
) -> (Builder<HeapAllocator>, BTreeSet<u64>) {
    let mut message = Builder::new_default();
    let mut list = journal::init_changes(&mut message, cut.len() as u32);
    let mut keys = BTreeSet::new();
    for (j, (key, narrowed)) in cut.iter().enumerate() {
        let parts: Vec<VectorPart<'_>> = narrowed.iter().map(Within::part).collect();
        let mut change = list.reborrow().get(j as u32);
        change.set_vid(*key);
        wire::write_parts(init(change, parts.len() as u32), &parts);
        keys.insert(*key);
    }
    (message, keys)
}

/// Vector `vid` of a request, refused: `badQuery`, naming it.
fn malformed(vid: u64, err: capnp::Error) -> Failure {
    Failure::new(
        ErrorKind::BadQuery,
        format!("vector {vid} is malformed: {err}"),
    )
}
