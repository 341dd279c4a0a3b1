//! What the fuzz targets drive (cargo feature `fuzzing`, off by default):
//! the slave's decoding of the vectors in a request, without a network.
//!
//! A request's vectors arrive as a list of `Part`s ([`read_vector`]: what
//! `handle`, `coordinate` and `gather` do with a partial result) or as a list
//! of `VidVector`s ([`import`]: what `Slave.import` reads before it touches
//! its store). Both read the message with the limits every connection uses
//! ([`read_message`]). An update's changes are read as `Slave.update`
//! reads them ([`update`]).
//!
//! And a master's start without a network ([`master_restart`]): what it
//! reads from its data directory and the cluster file before it serves.
//!
//! And the replies one process reads from another: hop reports ([`hops`]),
//! a coordinator's failed machines ([`coordinator_failures`]), a
//! `fetchMany` reply's copies ([`fetched_copies()`]).

use std::ops::Deref;

use bitfold_engine::fold::{Term, UnionPlan};
use capnp::Word;
use capnp::message::{Reader, ReaderSegments};
use capnp::serialize::BufferSegments;

use crate::bitfold_capnp::{coordinate_result, fetched_copies, hop, part, vid_vector};
use crate::wire;
use bitfold_proto::writes::{self, ChangeView};

pub use crate::master::start::{Started, restart as master_restart};

/// The most vectors one import may hold: [`import`] refuses more before it
/// reads any of them (docs/protocol.md §7, Limits).
pub const MAX_IMPORT_VECTORS: u32 = wire::MAX_IMPORT_VECTORS;

/// The most parts, over all its vectors, one import may hold: [`import`]
/// refuses more before it reads any of them (docs/protocol.md §7, Limits).
pub const MAX_IMPORT_PARTS: u32 = wire::MAX_IMPORT_PARTS;

/// The most parts one vector travels as: a list of more is refused before
/// it is read (docs/protocol.md §7, Limits).
pub const MAX_PARTS: u32 = wire::MAX_PARTS;

/// The most changes one update may hold: [`update`] refuses more before it
/// reads any of them (docs/slave-protocol.md S9).
pub const MAX_UPDATE_CHANGES: u32 = wire::MAX_UPDATE_CHANGES;

/// Reads `bytes` as one Cap'n Proto message (segment table first), with the
/// traversal limit of every connection (`MAX_MESSAGE_WORDS`). The message is
/// read in place, from one aligned copy of the whole words of `bytes` (a
/// stream reader cannot use a last partial word either): a segment table
/// that claims more words than follow it is refused without allocating what
/// it claims. (A connection's stream reader allocates what the table claims,
/// up to the message bound, before the words arrive.)
pub fn read_message(bytes: &[u8]) -> capnp::Result<Reader<BufferSegments<Words>>> {
    let whole = bytes.len() / 8;
    let mut words = Word::allocate_zeroed_vec(whole);
    Word::words_to_bytes_mut(&mut words).copy_from_slice(&bytes[..whole * 8]);
    let options = crate::net::reader_options();
    Ok(Reader::new(
        BufferSegments::new(Words(words), options)?,
        options,
    ))
}

/// Reads `bytes` as a connection reads its stream: message after message,
/// each into a buffer of its own, until the stream ends cleanly or a
/// message is refused. The segments of every message read, and the error
/// that stopped the reading, if one did.
pub fn read_stream(bytes: &[u8]) -> (Vec<Vec<Vec<u8>>>, Option<capnp::Error>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime without drivers starts");
    runtime.block_on(async {
        let mut stream = bytes;
        let mut messages = Vec::new();
        loop {
            match crate::net::framing::read_message(&mut stream, crate::net::reader_options()).await
            {
                Ok(Some(message)) => {
                    let segments = message.into_segments();
                    messages.push(
                        (0..)
                            .map_while(|id| segments.get_segment(id).map(<[u8]>::to_vec))
                            .collect(),
                    );
                }
                Ok(None) => return (messages, None),
                Err(err) => return (messages, Some(err)),
            }
        }
    })
}

/// What one change of an update does, as a slave hands it to its store.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Clear these bits of vector `vid`: one per part, in order.
    Clear(u64, Vec<u32>),
    /// Remove vector `vid`.
    Delete(u64),
    /// Make vector `vid` exactly these bits.
    Replace(u64, Vec<u32>),
}

/// `Slave.update`'s reading of `changes` (the request's list), without a
/// store: the request's error if it is malformed (over a bound, or a part
/// that does not read, or a replace whose parts overlap), else what it
/// hands its store, in order; each bit list ascending.
pub fn update(
    changes: capnp::struct_list::Reader<'_, crate::bitfold_capnp::change::Owned>,
) -> capnp::Result<Vec<Change>> {
    let read = writes::read_changes(changes)?;
    let views = writes::change_views(&read)?;
    let mut handed = Vec::new();
    for view in &views {
        match view {
            ChangeView::Clear(vid, parts) => handed.extend(
                parts
                    .iter()
                    .map(|part| Change::Clear(*vid, part.bits().collect())),
            ),
            ChangeView::Delete(vid) => handed.push(Change::Delete(*vid)),
            ChangeView::Replace(vid, vector) => {
                handed.push(Change::Replace(*vid, vector.as_part().bits().collect()));
            }
        }
    }
    Ok(handed)
}

/// The words of a message, read as bytes: what [`read_message`] reads.
pub struct Words(Vec<Word>);

impl Deref for Words {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        Word::words_to_bytes(&self.0)
    }
}

/// A vector received as a list of parts, as a slave reads it: its set bits
/// ascending (the union of its parts), and whether the parts also form a
/// term (ascending, key-disjoint: what a chain's partial result must be).
/// Fails as the slave would on a malformed part.
pub fn read_vector(
    list: capnp::struct_list::Reader<'_, part::Owned>,
) -> capnp::Result<(Vec<u32>, bool)> {
    let parts = wire::read_partial(list, &mut wire::HoleBudget::per_message())?;
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

/// `Slave.import`'s reading of `vectors` (the request's list), without a
/// store: the request's error if it is malformed (over a bound, or a part
/// that does not read), else each of its parts as the slave hands it to its
/// store, in the order they came: the part's vid and its set bits ascending.
/// (The store keeps each vid's union of its parts.)
pub fn import(
    vectors: capnp::struct_list::Reader<'_, vid_vector::Owned>,
) -> capnp::Result<Vec<(u64, Vec<u32>)>> {
    let parts = writes::read_import(vectors)?;
    let views = writes::import_views(&parts)?;
    Ok(views
        .iter()
        .map(|(vid, part)| (*vid, part.bits().collect()))
        .collect())
}

/// A reply's hop reports as a slave or the master reads them: each hop's
/// machine, kind (0 handle, 1 gather, 2 and), term, vids, bytes read,
/// bytes sent and micros.
pub fn hops(list: capnp::struct_list::Reader<'_, hop::Owned>) -> capnp::Result<Vec<[u64; 7]>> {
    Ok(crate::hop::read_all(list)?
        .iter()
        .map(|h| {
            [
                u64::from(h.machine),
                h.kind as u64,
                u64::from(h.term),
                h.vids,
                h.read_bytes,
                h.sent_bytes,
                h.micros,
            ]
        })
        .collect())
}

/// The machines a coordinator's result names failed, as the master reads
/// it for a query whose machine table holds `slaves`: each one's name,
/// address and reason (none for an answer).
pub fn coordinator_failures(
    result: coordinate_result::Reader<'_>,
    slaves: u32,
) -> capnp::Result<Vec<[String; 3]>> {
    Ok(crate::chain::coordinator_failures(result, slaves)?
        .into_iter()
        .map(|f| [f.name, f.addr, f.reason])
        .collect())
}

/// A vid a `fetchMany` reply answered, with its set bits ascending, or
/// `None` where the source does not hold it.
pub type Copied = (u64, Option<Vec<u32>>);

/// A `fetchMany` reply as the slave that pulls the vids `asked` reads it:
/// how many vids it answered, and each vid answered with its set bits
/// ascending, or `None` where the source does not hold it (the vectors
/// sent in their order, then the vids missing).
pub fn fetched_copies(
    copies: fetched_copies::Reader<'_>,
    asked: &[u64],
) -> capnp::Result<(u32, Vec<Copied>)> {
    let read = writes::read_copies(copies, asked)?;
    let vectors = read
        .vectors
        .iter()
        .map(|(vid, vector)| (*vid, vector.as_ref().map(|v| v.as_part().bits().collect())))
        .collect();
    Ok((read.answered, vectors))
}
