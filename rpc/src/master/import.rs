//! Import fan-out: every non-empty vector goes to all its owners, and its
//! vid is recorded in the catalog only once every owner has stored it.

use bitfold_engine::VectorPart;
use capnp::capability::Promise;

use super::Master;
use super::reply::Failure;
use crate::bitfold_capnp::{outcome, vid_vector};
use crate::catalog::Catalog;
use crate::client::ErrorKind;
use crate::wire::{self, WirePart};

impl Master {
    /// Sends every non-empty vector to all its owners, then records the
    /// vids; returns the bytes of the vectors stored.
    pub(super) async fn import_vectors(
        &self,
        vectors: capnp::struct_list::Reader<'_, vid_vector::Owned>,
    ) -> Result<u64, Failure> {
        wire::check_import(vectors).map_err(bad_query)?;
        let read = read_vectors(vectors)?;
        let views = holding_bits(&read)?;
        let layout = self.layout();
        let slaves = layout.slaves().len();
        let mut by_owner: Vec<Vec<usize>> = vec![Vec::new(); slaves];
        let mut vids = Vec::new();
        for (i, (vid, _)) in views.iter().enumerate() {
            vids.push(*vid);
            for owner in layout.write_owners(*vid) {
                by_owner[owner].push(i);
            }
        }
        let bytes = views
            .iter()
            .flat_map(|(_, parts)| parts)
            .map(VectorPart::byte_len)
            .sum();
        let _writing = self.writes.lock().await;
        for owner in (0..slaves).filter(|&o| !by_owner[o].is_empty()) {
            self.catch_up(owner).await.map_err(|reason| {
                self.unavailable(
                    format!(
                        "the import was not applied: slave {} has not caught up on earlier \
                         updates ({reason}); import again once it is up",
                        self.slave_name(owner)
                    ),
                    &[owner],
                )
            })?;
        }
        let views = &views;
        let sends = by_owner
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.is_empty())
            .map(|(owner, entries)| {
                let entry = &layout.slaves()[owner];
                let timeout = if self.slaves.borrow()[owner].up {
                    self.options.import_timeout
                } else {
                    self.options.rpc_timeout
                };
                async move {
                    let answer = self
                        .pool
                        .call(&entry.addr, timeout, |client| {
                            let mut request = client.import_request();
                            let mut list = request.get().init_vectors(entries.len() as u32);
                            for (j, &i) in entries.iter().enumerate() {
                                let (vid, parts) = &views[i];
                                let mut entry = list.reborrow().get(j as u32);
                                entry.set_vid(*vid);
                                wire::write_parts(entry.init_parts(parts.len() as u32), parts);
                            }
                            Promise::from_future(request.send().promise)
                        })
                        .await;
                    (owner, answer)
                }
            });
        let answers = futures::future::join_all(sends).await;
        let mut down = Vec::new();
        let mut reasons = Vec::new();
        for (owner, answer) in answers {
            let refused = match answer {
                Ok(response) => match response
                    .get()
                    .and_then(|r| r.get_outcome())
                    .and_then(|o| Ok(o.which()?))
                {
                    Ok(outcome::Ok(())) => None,
                    Ok(outcome::Error(error)) => {
                        let message = error
                            .and_then(|e| Ok(e.get_message()?.to_string()?))
                            .unwrap_or_else(|e| e.to_string());
                        return Err(Failure::new(
                            ErrorKind::Internal,
                            format!("slave {}: {message}", self.slave_name(owner)),
                        ));
                    }
                    Err(err) => Some(format!("it answered a malformed message: {err}")),
                },
                Err(reason) => Some(reason),
            };
            if let Some(reason) = refused {
                self.mark_down(owner, &reason);
                reasons.push(format!("{}: {reason}", self.slave_name(owner)));
                down.push(owner);
            }
        }
        if !down.is_empty() {
            // Vectors that already existed may now differ between the owners
            // that stored the import and those that failed: the latter are
            // read for them only once they have been copied back.
            {
                let catalog = self.catalog.borrow();
                for &owner in &down {
                    let stale = by_owner[owner].iter().map(|&i| views[i].0);
                    let stale = stale.filter(|&vid| {
                        catalog.contains(vid)
                            && layout.read_owners(vid).iter().any(|o| !down.contains(o))
                    });
                    self.note_failed_write(owner, stale.collect::<Vec<_>>());
                }
            }
            if let Err(reason) = self.record_missed().await {
                tracing::error!("{reason}");
                reasons.push(format!(
                    "{reason}: do not restart the master before importing again"
                ));
            }
            let failure = self.unavailable(
                format!(
                    "the import was not recorded: every owner must store it ({}); \
                     import again once they are up",
                    reasons.join("; ")
                ),
                &down,
            );
            return Err(failure);
        }
        Catalog::insert(&self.catalog, vids)
            .await
            .map(|_| bytes)
            .map_err(|e| {
                Failure::internal(format!(
                    "the vectors are stored but the master could not record them: {e}"
                ))
            })
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

/// Vector `vid` of a request, refused: `badQuery`, naming it.
fn malformed(vid: u64, err: capnp::Error) -> Failure {
    Failure::new(
        ErrorKind::BadQuery,
        format!("vector {vid} is malformed: {err}"),
    )
}
