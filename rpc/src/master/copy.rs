//! Copying vectors onto an owner that should hold them, for a move
//! (`rebalance`) or a refill: each exactly as an owner that serves it holds
//! it (a `replace`).
//!
//! The copies go in rounds: each round asks every source slave for its next
//! vectors with one `fetchMany` (at most [`ROUND_BYTES`] of them), and the
//! whole round goes to the owner in `update`s of at most [`UPDATE_BYTES`]
//! (one, unless a reply holds huge vectors), its parts copied from the
//! replies into the request as they came. While a round is sent, the next
//! one is fetched; no more than those two rounds are in flight, which
//! bounds the memory and the cores a copy takes from queries.

use std::collections::BTreeMap;
use std::ops::Range;

use capnp::capability::{Promise, Response};

use super::Master;
use super::layout::Layout;
use super::reply::Failure;
use crate::bitfold_capnp::{change_result, slave};
use crate::wire;

/// Bytes of vectors one source slave sends per round.
const ROUND_BYTES: u64 = 4 << 20;

/// Bytes of replies one `update` carries, so that it stays under the
/// message bound ([`crate::MAX_MESSAGE_WORDS`]): a reply over this goes
/// alone, and a reply is at most [`wire::MAX_FETCH_BYTES`] and one vector
/// (which fits in a message by itself), well under the bound.
const UPDATE_BYTES: u64 = 256 << 20;

/// A `fetchMany` reply: copies, sent on without decoding them.
type Fetched = Response<slave::fetch_many_results::Owned>;

/// The vids one source slave is asked for, and how many it has answered.
struct Source {
    slave: usize,
    vids: Vec<u64>,
    answered: usize,
}

/// What went wrong with a copy.
pub(super) enum CopyError {
    /// No source could give the copies (the message says why).
    Fetch(Failure),
    /// The owner did not take them: it did not answer or said why.
    Send(String),
}

/// What a copy moved.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Copied {
    /// Vectors copied.
    pub(super) vectors: u64,
    /// Their bytes, as they travelled.
    pub(super) bytes: u64,
}

impl Master {
    /// Copies each of `vids` onto slave `owner` from an owner that serves it
    /// under `layout`. The caller holds the write lock, so no write falls
    /// between a read and its copy.
    pub(super) async fn copy_vectors(
        &self,
        layout: &Layout,
        owner: usize,
        vids: &[u64],
    ) -> Result<Copied, CopyError> {
        let mut sources = self.sources(layout, vids).map_err(CopyError::Fetch)?;
        let mut copied = Copied::default();
        let mut round = self
            .fetch_round(layout, &mut sources)
            .await
            .map_err(CopyError::Fetch)?;
        while !round.is_empty() {
            for fetched in &round {
                let copies = fetched.get().and_then(|r| r.get_copies());
                copied.vectors += copies
                    .and_then(|c| c.get_vectors())
                    .map_or(0, |v| u64::from(v.len()));
                copied.bytes += reply_bytes(fetched);
            }
            let (sent, next) = futures::future::join(
                self.send_copies(layout, owner, &round),
                self.fetch_round(layout, &mut sources),
            )
            .await;
            sent.map_err(CopyError::Send)?;
            round = next.map_err(CopyError::Fetch)?;
        }
        Ok(copied)
    }

    /// Groups `vids` by the first of their owners that serves them.
    fn sources(&self, layout: &Layout, vids: &[u64]) -> Result<Vec<Source>, Failure> {
        let mut by_source: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for &vid in vids {
            let owners = layout.read_owners(vid);
            let Some(source) = owners.iter().copied().find(|&o| self.serves(o, vid)) else {
                return Err(self.unavailable(
                    format!("no live owner holds vector {vid} to copy it from"),
                    &owners,
                ));
            };
            by_source.entry(source).or_default().push(vid);
        }
        Ok(by_source
            .into_iter()
            .map(|(slave, vids)| Source {
                slave,
                vids,
                answered: 0,
            })
            .collect())
    }

    /// Asks every source with vids left for its next ones; empty once every
    /// vid has been answered.
    async fn fetch_round(
        &self,
        layout: &Layout,
        sources: &mut [Source],
    ) -> Result<Vec<Fetched>, Failure> {
        let fetches = sources
            .iter_mut()
            .filter(|s| s.answered < s.vids.len())
            .map(|source| async move {
                let rest = &source.vids[source.answered..];
                let asked = &rest[..rest.len().min(wire::MAX_FETCH_VIDS as usize)];
                let addr = &layout.slaves()[source.slave].addr;
                let fail = |reason: String| {
                    self.mark_down(source.slave, &reason);
                    self.unavailable(
                        format!("vectors to copy could not be read: {reason}"),
                        &[source.slave],
                    )
                };
                let fetched = self
                    .pool
                    .call(addr, self.options.import_timeout, |client| {
                        let mut request = client.fetch_many_request();
                        request.get().set_vids(bytemuck::cast_slice(asked));
                        request.get().set_max_bytes(ROUND_BYTES);
                        request.send().promise
                    })
                    .await
                    .map_err(fail)?;
                let answered = fetched
                    .get()
                    .and_then(|r| r.get_copies())
                    .map(|c| c.get_answered() as usize)
                    .map_err(|e| fail(format!("it answered a malformed message: {e}")))?;
                if answered == 0 || answered > asked.len() {
                    return Err(fail(format!(
                        "it answered {answered} of the {} vids asked",
                        asked.len()
                    )));
                }
                source.answered += answered;
                Ok(fetched)
            });
        futures::future::join_all(fetches)
            .await
            .into_iter()
            .collect()
    }

    /// Replaces each vector of `round` on slave `owner` by its copy, in
    /// updates of at most [`UPDATE_BYTES`] of replies.
    async fn send_copies(
        &self,
        layout: &Layout,
        owner: usize,
        round: &[Fetched],
    ) -> Result<(), String> {
        let addr = &layout.slaves()[owner].addr;
        let sizes: Vec<u64> = round.iter().map(reply_bytes).collect();
        for batch in split_by_bytes(&sizes, UPDATE_BYTES) {
            let response = self
                .pool
                .call(addr, self.options.import_timeout, |client| {
                    write_copies(client, &round[batch.clone()])
                })
                .await?;
            read_changed(&response)?;
        }
        Ok(())
    }
}

/// Bytes of a reply, as it travelled.
fn reply_bytes(fetched: &Fetched) -> u64 {
    fetched
        .get()
        .and_then(|r| r.total_size())
        .map_or(0, |s| s.word_count * 8)
}

/// Consecutive ranges of `sizes` adding up to at most `bound` each; a size
/// over `bound` gets a range of its own.
fn split_by_bytes(sizes: &[u64], bound: u64) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let mut total = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        match ranges.last_mut() {
            Some(last) if total.saturating_add(size) <= bound => {
                last.end = i + 1;
                total += size;
            }
            _ => {
                ranges.push(i..i + 1);
                total = size;
            }
        }
    }
    ranges
}

/// The `update` call replacing each vector of `round` by its copy; a vid
/// its source did not hold (deleted since it was listed) is deleted.
fn write_copies(
    client: slave::Client,
    round: &[Fetched],
) -> Promise<Response<slave::update_results::Owned>, capnp::Error> {
    let built = (|| -> capnp::Result<_> {
        let mut request = client.update_request();
        let mut replies = Vec::with_capacity(round.len());
        let mut changes = 0u32;
        for fetched in round {
            let copies = fetched.get()?.get_copies()?;
            let vectors = copies.get_vectors()?;
            let missing = wire::vids(copies.get_missing()?)?;
            changes = changes
                .saturating_add(vectors.len())
                .saturating_add(missing.len() as u32);
            replies.push((vectors, missing));
        }
        let mut list = request.get().init_changes(changes);
        let mut i = 0;
        for (vectors, missing) in replies {
            for vector in vectors {
                let mut change = list.reborrow().get(i);
                change.set_vid(vector.get_vid());
                change.set_replace(vector.get_parts()?)?;
                i += 1;
            }
            for &vid in missing.iter() {
                let mut change = list.reborrow().get(i);
                change.set_vid(vid);
                change.set_delete(());
                i += 1;
            }
        }
        Ok(request)
    })();
    match built {
        Ok(request) => Promise::from_future(request.send().promise),
        Err(err) => Promise::err(err),
    }
}

/// The outcome of an `update` call.
pub(super) fn read_changed(
    response: &Response<slave::update_results::Owned>,
) -> Result<(), String> {
    let result = response
        .get()
        .and_then(|r| r.get_result())
        .and_then(|r| Ok(r.which()?))
        .map_err(|e| format!("it answered a malformed message: {e}"))?;
    match result {
        change_result::Changed(_) => Ok(()),
        change_result::Error(text) => Err(text
            .and_then(|t| Ok(t.to_string()?))
            .unwrap_or_else(|e| format!("it answered a malformed message: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_stay_under_their_byte_bound() {
        assert_eq!(split_by_bytes(&[], 10), Vec::<Range<usize>>::new());
        assert_eq!(split_by_bytes(&[4, 4, 2], 10).len(), 1);
        // A reply over the bound goes alone; the others fill updates up to it.
        assert_eq!(
            split_by_bytes(&[4, 7, 30, 3, 3, 3, 3], 10),
            [0..1, 1..2, 2..3, 3..6, 6..7]
        );
        let sizes = [64 << 20, 64 << 20, 600 << 20, 64 << 20, 64 << 20];
        for range in split_by_bytes(&sizes, UPDATE_BYTES) {
            let bytes: u64 = sizes[range.clone()].iter().sum();
            assert!(range.len() == 1 || bytes <= UPDATE_BYTES, "{range:?}");
        }
    }
}
