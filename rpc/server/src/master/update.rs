//! Updates (docs/protocol.md §8): clearing bits and deleting vectors, on
//! every owner, exactly.
//!
//! Writes (imports, updates and the catch-up of an owner) are serialised by
//! the master's write lock. An update is first checked whole (nothing is
//! changed by a bad one), refused while an owner it needs is down (nothing
//! changed), then recorded in the [`journal`](super::journal) before any
//! owner applies it. A delete also takes its vids out of the catalog and
//! waits for the queries planned before that ([`InFlight`](super::in_flight)).
//! Then every owner applies its share; those that did are acknowledged in
//! the journal. An owner that failed is marked down: it is used again only
//! once it has caught up on every update it missed, in order ([`Master::catch_up`]).

use std::collections::BTreeSet;

use capnp::message::{Builder, HeapAllocator};

use super::Master;
use super::copy::read_changed;
use super::import::{changes_of, cut, holding_bits, read_vectors, within};
use super::journal::{self, Pending};
use super::probe::Writes;
use super::reply::Failure;
use crate::bitfold_capnp::{change, vid_span, vid_vector};
use crate::wire;
use bitfold_proto::ErrorKind;

/// What a write does, for the catalog and the count it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Import,
    Clear,
    Delete,
}

impl Master {
    /// Clears the bits of `vectors` on every owner; returns how many
    /// vectors lost a bit.
    pub(super) async fn clear_vectors(
        &self,
        vectors: capnp::struct_list::Reader<'_, vid_vector::Owned>,
    ) -> Result<u64, Failure> {
        within(vectors.len(), wire::MAX_IMPORT_VECTORS, "vectors to clear")?;
        let read = read_vectors(vectors)?;
        let mut chosen = holding_bits(&read)?;
        let pieces = self.layout().current.pieces();
        chosen.retain(|(vid, _)| *vid <= pieces.max_vid());
        let mut cut = cut(pieces, &chosen);
        cut.retain(|(key, _)| self.records.catalog().contains(*key));
        let (message, keys) = changes_of(&cut, |change, len| change.init_clear(len));
        self.apply(message, keys, Kind::Clear).await
    }

    /// Deletes every existing vector in `spans` on every owner; returns how
    /// many there were.
    pub(super) async fn delete_spans(
        &self,
        spans: capnp::struct_list::Reader<'_, vid_span::Owned>,
    ) -> Result<u64, Failure> {
        within(spans.len(), wire::MAX_DELETE_SPANS, "spans to delete")?;
        let pieces = self.layout().current.pieces();
        let present = self.records.catalog().pieces(pieces);
        let mut vids = BTreeSet::new();
        for span in spans.iter() {
            let (first, last) = (span.get_first(), span.get_last());
            if first > last {
                return Err(Failure::new(
                    ErrorKind::BadQuery,
                    format!("bad span {first}-{last}: the first vid must not exceed the last"),
                ));
            }
            for &piece in &present {
                if let Some(keys) = pieces.keys(piece, first, last) {
                    let catalog = self.records.catalog();
                    vids.extend(catalog.range(*keys.start(), *keys.end()));
                }
            }
        }
        let mut message = Builder::new_default();
        let mut list = journal::init_changes(&mut message, vids.len() as u32);
        for (j, &vid) in vids.iter().enumerate() {
            let mut change = list.reborrow().get(j as u32);
            change.set_vid(vid);
            change.set_delete(());
        }
        self.apply(message, vids, Kind::Delete).await
    }

    /// Records the write made of `changes` (a new write's message,
    /// [`journal::init_changes`]: to the existing keys `vids`, or for an
    /// import the keys it sets bits of) and has every owner apply it;
    /// returns how many vectors (not pieces) it changed.
    pub(super) async fn apply(
        &self,
        changes: Builder<HeapAllocator>,
        vids: BTreeSet<u64>,
        kind: Kind,
    ) -> Result<u64, Failure> {
        if vids.is_empty() {
            return Ok(0);
        }
        let _writing = self.records.lock().await;
        let layout = self.layout();
        let owners: BTreeSet<usize> = vids.iter().flat_map(|&v| layout.write_owners(v)).collect();
        self.ready_to_write(&owners).await?;
        let id = self
            .fence
            .write_number()
            .await
            .map_err(|e| Failure::internal(format!("nothing was changed: the master {e}")))?;
        let recorded = self.records.record(id, changes, owners.clone());
        let write = recorded.map_err(Failure::internal)?;
        // From now until the write is done, queries read its vectors from
        // their primary owners only; those planned before may read any
        // owner, so no owner applies it before they have ended.
        let _pinned = self.records.pin(vids.clone());
        let drained = self.in_flight.drain();
        // An import's owners write its vectors (staged, not applied) while
        // the master writes its journal: they apply them only once it is
        // durable.
        let (persisted, staged, ()) = if kind == Kind::Import {
            let stages = owners.iter().map(|&owner| async move {
                let staged = match self.share(owner, id) {
                    Ok(Some(share)) => self
                        .send_import(owner, id, &share, true)
                        .await
                        .map(|()| share),
                    Ok(None) => Err("the write is no longer pending".to_owned()),
                    Err(reason) => Err(reason),
                };
                (owner, staged)
            });
            futures::join!(write.persist(), futures::future::join_all(stages), drained)
        } else {
            let (persisted, ()) = futures::join!(write.persist(), drained);
            (persisted, Vec::new(), ())
        };
        let mut staged: std::collections::BTreeMap<usize, Result<Share, String>> =
            staged.into_iter().collect();
        if let Err(err) = persisted {
            self.records.withdraw(id, &Vec::from_iter(owners));
            // Among several masters, a record Raft did not commit in time
            // stays in the leader's log and may be committed yet (then a
            // master starting from the records rolls the write forward):
            // its outcome is unknown, not "nothing was changed".
            return Err(if self.quorum.is_some() {
                Failure::new(
                    ErrorKind::Unavailable,
                    format!(
                        "unavailable: the write may or may not be applied: the masters did not \
                         record it in time ({err}); read the vectors, or write them again once \
                         a master leads"
                    ),
                )
            } else {
                Failure::internal(format!(
                    "nothing was changed: the master could not record the write: {err}"
                ))
            });
        }
        if kind == Kind::Delete {
            self.records
                .remove(vids.iter().copied())
                .await
                .map_err(|e| self.recorded_but(format!("the catalog could not record it: {e}")))?;
            // A record left behind only names vectors that no longer exist.
            if self.slaves.forget(&vids)
                && let Err(reason) = self.record_missed().await
            {
                tracing::warn!("{reason}");
            }
            self.in_flight.drain().await;
        }
        let sends = owners.iter().map(|&owner| {
            let staged = staged.remove(&owner);
            async move {
                let answer = match staged {
                    Some(Ok(share)) => self
                        .commit_import(owner, id, &share)
                        .await
                        .map(|()| Vec::new()),
                    Some(Err(reason)) => Err(reason),
                    None => self.send_update(owner, id).await,
                };
                (owner, answer)
            }
        });
        let answers = futures::future::join_all(sends).await;
        let mut changed = BTreeSet::new();
        let (mut applied, mut missed) = (Vec::new(), Vec::new());
        for (owner, answer) in answers {
            match answer {
                Ok(vids) => {
                    changed.extend(vids);
                    applied.push(owner);
                }
                Err(reason) => {
                    // Asked again at once: a slave that restarted refuses a
                    // call for its old process, and is checked and caught
                    // up (this write included) if it answers now.
                    self.mark_down(owner, &reason);
                    self.probe(owner, Writes::Held).await;
                    if self.records.journal().waiting_for(owner).contains(&id) {
                        missed.push(format!("{}: {reason}", self.slave_name(owner)));
                    }
                }
            }
        }
        if kind == Kind::Import {
            // Once recorded the import is rolled forward on every owner:
            // its vectors exist, whichever owners have it yet.
            self.records
                .insert(vids.iter().copied())
                .await
                .map_err(|e| self.recorded_but(format!("the catalog could not record it: {e}")))?;
        }
        self.records
            .acknowledge(id, &applied)
            .await
            .map_err(|e| self.recorded_but(e))?;
        if !missed.is_empty() {
            return Err(self.recorded_but(format!(
                "it is applied on {} of {} owners and will be applied on the others when \
                 they are back (they serve nothing meanwhile): {}",
                owners.len() - missed.len(),
                owners.len(),
                missed.join("; ")
            )));
        }
        let pieces = layout.current.pieces();
        let distinct = |keys: &BTreeSet<u64>| {
            let vids: BTreeSet<u64> = keys.iter().map(|&key| pieces.vid(key)).collect();
            vids.len() as u64
        };
        Ok(match kind {
            Kind::Clear => distinct(&changed),
            Kind::Delete | Kind::Import => distinct(&vids),
        })
    }

    /// Makes every one of `owners` ready for a write: a slave marked down is
    /// asked once more, and each catches up on the writes it missed. Refused,
    /// with nothing changed, while one is down.
    async fn ready_to_write(&self, owners: &BTreeSet<usize>) -> Result<(), Failure> {
        for &owner in owners {
            if !self.slaves.is_up(owner) {
                self.probe(owner, Writes::Held).await;
            }
            self.catch_up(owner).await.map_err(|reason| {
                self.unavailable(
                    format!(
                        "nothing was changed: slave {} has not caught up on earlier writes \
                         ({reason}); run it again once it is up",
                        self.slave_name(owner)
                    ),
                    &[owner],
                )
            })?;
        }
        let down: Vec<usize> = owners
            .iter()
            .copied()
            .filter(|&o| !self.slaves.is_up(o))
            .collect();
        if !down.is_empty() {
            return Err(self.unavailable(
                "nothing was changed: every owner of the vectors must apply a write; run it \
                 again once they are up"
                    .into(),
                &down,
            ));
        }
        Ok(())
    }

    /// The error of a write that is recorded (and so will be rolled
    /// forward) but not yet applied everywhere.
    fn recorded_but(&self, why: String) -> Failure {
        Failure::new(
            ErrorKind::Unavailable,
            format!("unavailable: the write is recorded but not yet complete: {why}"),
        )
    }

    /// Applies, in order, every recorded write `owner` has not applied yet.
    /// Call it holding the write lock.
    pub(super) async fn catch_up(&self, owner: usize) -> Result<(), String> {
        let waiting = self.records.journal().waiting_for(owner);
        for id in waiting {
            self.send_update(owner, id).await?;
            self.records.acknowledge(id, &[owner]).await?;
            tracing::info!(
                "slave {} applied write {id}, which it had missed",
                self.slave_name(owner)
            );
        }
        Ok(())
    }

    /// Sends `owner` its share of write `id`, in pieces within the bounds
    /// of one message ([`pieces`]), each stamped with the write's number and
    /// its piece so that the owner's fence orders them; an import's pieces
    /// travel as imports. Returns the vids it changed (none for an import).
    /// (A piece the owner applied before, and sends again when it catches
    /// up, it does not apply twice.)
    async fn send_update(&self, owner: usize, id: u64) -> Result<Vec<u64>, String> {
        let Some(share) = self.share(owner, id)? else {
            return Ok(Vec::new());
        };
        if share.import {
            self.send_import(owner, id, &share, false).await?;
            return Ok(Vec::new());
        }
        let addr = self.layout().slaves()[owner].addr.clone();
        let mut changed = Vec::new();
        for (piece, indices) in share.pieces.iter().enumerate() {
            let response = self
                .pool
                .call(&addr, self.options.import_timeout, |client| {
                    let mut request = client.update_request();
                    let stamp = request.get().init_stamp();
                    self.stamp(stamp, self.slaves.session(owner), id, piece as u64);
                    let built = self.copy_changes(id, indices, |n| request.get().init_changes(n));
                    match built {
                        Ok(()) => capnp::capability::Promise::from_future(request.send().promise),
                        Err(err) => capnp::capability::Promise::err(err),
                    }
                })
                .await?;
            changed.extend(read_changed(&response)?);
            self.saw_write_applied(owner, id, response.get().and_then(|r| r.get_state()))?;
        }
        Ok(changed)
    }

    /// Sends `owner` its share of import `id` as imports, piece by piece:
    /// applied, or with `stage` only written until [`Master::commit_import`].
    async fn send_import(
        &self,
        owner: usize,
        id: u64,
        share: &Share,
        stage: bool,
    ) -> Result<(), String> {
        let addr = self.layout().slaves()[owner].addr.clone();
        for (piece, indices) in share.pieces.iter().enumerate() {
            let response = self
                .pool
                .call(&addr, self.options.import_timeout, |client| {
                    let mut request = client.import_request();
                    let stamp = request.get().init_stamp();
                    self.stamp(stamp, self.slaves.session(owner), id, piece as u64);
                    request.get().set_stage(stage);
                    let built = self.copy_imports(id, indices, |n| request.get().init_vectors(n));
                    match built {
                        Ok(()) => capnp::capability::Promise::from_future(request.send().promise),
                        Err(err) => capnp::capability::Promise::err(err),
                    }
                })
                .await?;
            self.read_imported(response.get().and_then(|r| r.get_outcome()))?;
            if !stage {
                self.saw_write_applied(owner, id, response.get().and_then(|r| r.get_state()))?;
            }
        }
        Ok(())
    }

    /// Has `owner` apply the import `id` it staged, every piece at once.
    async fn commit_import(&self, owner: usize, id: u64, share: &Share) -> Result<(), String> {
        let addr = self.layout().slaves()[owner].addr.clone();
        let pieces = u32::try_from(share.pieces.len())
            .map_err(|_| format!("write {id} has more pieces than a commit names"))?;
        let response = self
            .pool
            .call(&addr, self.options.import_timeout, |client| {
                let mut request = client.commit_request();
                self.stamp(
                    request.get().init_stamp(),
                    self.slaves.session(owner),
                    id,
                    0,
                );
                request.get().set_pieces(pieces);
                request.send().promise
            })
            .await?;
        self.read_imported(response.get().and_then(|r| r.get_outcome()))?;
        self.saw_write_applied(owner, id, response.get().and_then(|r| r.get_state()))
    }

    /// Slave `owner`'s share of pending write `id`: its changes, cut in
    /// pieces; `None` when the write is no longer pending.
    fn share(&self, owner: usize, id: u64) -> Result<Option<Share>, String> {
        let layout = self.layout();
        let journal = self.records.journal();
        let Some(pending) = journal.get(id) else {
            return Ok(None);
        };
        let changes = pending.changes().map_err(|e| e.to_string())?;
        let mut parts = Vec::new();
        let mut mine = Vec::new();
        let mut import = false;
        for (i, change) in changes.iter().enumerate() {
            if layout.write_owners(change.get_vid()).contains(&owner) {
                mine.push(i as u32);
                parts.push(match change.which() {
                    Ok(
                        change::Clear(Ok(list)) | change::Replace(Ok(list)) | change::Set(Ok(list)),
                    ) => list.len(),
                    _ => 0,
                });
                import |= matches!(change.which(), Ok(change::Set(_)));
            }
        }
        let pieces = pieces(&parts)
            .into_iter()
            .map(|range| mine[range].to_vec())
            .collect();
        Ok(Some(Share { pieces, import }))
    }
}

/// A slave's share of a pending write.
pub(super) struct Share {
    /// The indices of its changes in the write, in pieces that each fit
    /// one message.
    pieces: Vec<Vec<u32>>,
    /// Whether the write is an import (its changes are `set`s).
    import: bool,
}

impl Master {
    /// Copies the changes `indices` of pending write `id` into the list
    /// `init` makes (of their count).
    fn copy_changes<'b>(
        &self,
        id: u64,
        indices: &[u32],
        init: impl FnOnce(u32) -> capnp::struct_list::Builder<'b, change::Owned>,
    ) -> capnp::Result<()> {
        let journal = self.records.journal();
        let changes = pending_changes(&journal, id)?;
        let mut list = init(indices.len() as u32);
        for (j, &i) in indices.iter().enumerate() {
            list.set_with_caveats(j as u32, changes.get(i))?;
        }
        Ok(())
    }

    /// Copies the changes `indices` of pending import `id` (each a `set`)
    /// into the list of vectors `init` makes (of their count).
    fn copy_imports<'b>(
        &self,
        id: u64,
        indices: &[u32],
        init: impl FnOnce(u32) -> capnp::struct_list::Builder<'b, vid_vector::Owned>,
    ) -> capnp::Result<()> {
        let journal = self.records.journal();
        let changes = pending_changes(&journal, id)?;
        let mut list = init(indices.len() as u32);
        for (j, &i) in indices.iter().enumerate() {
            let change = changes.get(i);
            let change::Set(parts) = change.which()? else {
                return Err(capnp::Error::failed(format!(
                    "write {id} mixes an import with other changes"
                )));
            };
            let mut vector = list.reborrow().get(j as u32);
            vector.set_vid(change.get_vid());
            vector.set_parts(parts?)?;
        }
        Ok(())
    }
}

/// The changes of pending write `id` of `journal`.
fn pending_changes<'j>(
    journal: &'j super::journal::Journal,
    id: u64,
) -> capnp::Result<capnp::struct_list::Reader<'j, change::Owned>> {
    journal
        .get(id)
        .ok_or_else(|| capnp::Error::failed("the write is no longer pending".into()))
        .and_then(Pending::changes)
}

/// Cuts a list of changes, given the parts of each, into consecutive
/// pieces that each fit one update message: at most
/// [`wire::MAX_UPDATE_CHANGES`] changes and [`wire::MAX_IMPORT_PARTS`] parts
/// (one change never holds more than [`wire::MAX_PARTS`], fewer than that).
fn pieces(parts: &[u32]) -> Vec<std::ops::Range<usize>> {
    let mut pieces = Vec::new();
    let (mut start, mut in_piece) = (0, 0u32);
    for (i, &n) in parts.iter().enumerate() {
        let full = i - start == wire::MAX_UPDATE_CHANGES as usize
            || in_piece.saturating_add(n) > wire::MAX_IMPORT_PARTS;
        if full && i > start {
            pieces.push(start..i);
            (start, in_piece) = (i, 0);
        }
        in_piece = in_piece.saturating_add(n);
    }
    if start < parts.len() {
        pieces.push(start..parts.len());
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_is_sent_in_pieces_within_the_message_bounds() {
        let most = wire::MAX_UPDATE_CHANGES as usize;
        assert_eq!(pieces(&[]), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(pieces(&[0; 3]), vec![0..3]);
        assert_eq!(pieces(&vec![0; most]), vec![0..most]);
        assert_eq!(
            pieces(&vec![0; 2 * most + 1]),
            [0..most, most..2 * most, 2 * most..2 * most + 1]
        );
        // Parts: eight changes of the most parts a vector holds fill a
        // message's 1,048,576; the ninth starts the next.
        let full = wire::MAX_PARTS;
        assert_eq!(pieces(&[full; 9]), [0..8, 8..9]);
        assert_eq!(
            pieces(&[1, full, full, full, full, full, full, full, full]),
            [0..8, 8..9]
        );
        // Any list: consecutive pieces covering it, each within both
        // bounds, and each as long as they allow.
        let parts = [
            full - 1,
            7,
            full,
            3,
            full,
            full,
            full,
            full,
            full,
            2,
            0,
            full,
        ];
        let cut = pieces(&parts);
        assert_eq!(cut.first().map(|p| p.start), Some(0));
        assert_eq!(cut.last().map(|p| p.end), Some(parts.len()));
        for (piece, next) in cut.iter().zip(cut.iter().skip(1)) {
            assert_eq!(piece.end, next.start);
            let held: u32 = parts[piece.clone()].iter().sum();
            assert!(held <= wire::MAX_IMPORT_PARTS && piece.len() <= most);
            assert!(held + parts[next.start] > wire::MAX_IMPORT_PARTS);
        }
    }
}
