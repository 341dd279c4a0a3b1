//! Copying vectors onto an owner that should hold them, for a move
//! (`rebalance`) or a refill: each exactly as an owner that serves it holds
//! it (a `replace`).
//!
//! The owner pulls the copies straight from their sources (`Slave.pull`):
//! the master only says which vids to take from where, so the vectors
//! cross the network once and the master's core stays with queries. Each
//! call copies one round of at most [`ROUND_BYTES`] from one source, which
//! the owner stores as one segment before it answers; the rounds from
//! different sources run at once, so one source sends while the owner
//! stores another's round.

use std::collections::BTreeMap;

use capnp::capability::Response;

use super::layout::Layout;
use super::reply::Failure;
use super::{Master, slave_said};
use crate::bitfold_capnp::{change_result, pull_outcome, slave};
use crate::chain::VidRun;
use crate::wire;

/// Bytes of vectors one `pull` copies, which the owner writes as one
/// segment: with a `rebalance` step of 2,048 vids, one segment per source
/// and step, so a move of about 100 MB onto a fifth slave writes 5 to 7
/// segments, fewer than the 8 that fill a size tier and make the owner
/// merge them mid-move. Larger moves merge as large imports do.
const ROUND_BYTES: u64 = 32 << 20;

/// How many times in a row a round may be overtaken by other sources'
/// rounds before the copy gives up (each overtaking round was stored).
const MAX_STALE: u32 = 8;

/// The vids one source slave is asked for.
struct Source {
    slave: usize,
    vids: Vec<u64>,
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
        let sources = self.sources(layout, vids).map_err(CopyError::Fetch)?;
        let pulls = sources
            .iter()
            .map(|source| self.pull_from(layout, owner, source));
        let mut copied = Copied::default();
        for pulled in futures::future::join_all(pulls).await {
            let pulled = pulled?;
            copied.vectors += pulled.vectors;
            copied.bytes += pulled.bytes;
        }
        Ok(copied)
    }

    /// Groups `vids` by the first of their owners that serves them.
    fn sources(&self, layout: &Layout, vids: &[u64]) -> Result<Vec<Source>, Failure> {
        let mut by_source: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        let holding = self.slaves.holding();
        for &vid in vids {
            let owners = layout.read_owners(vid);
            let Some(source) = owners
                .iter()
                .copied()
                .find(|&o| holding(o, VidRun::one(vid)))
            else {
                return Err(self.unavailable(
                    format!("no live owner holds vector {vid} to copy it from"),
                    &owners,
                ));
            };
            by_source.entry(source).or_default().push(vid);
        }
        Ok(by_source
            .into_iter()
            .map(|(slave, vids)| Source { slave, vids })
            .collect())
    }

    /// Has slave `owner` pull the vids of `source` from it, round after round.
    async fn pull_from(
        &self,
        layout: &Layout,
        owner: usize,
        source: &Source,
    ) -> Result<Copied, CopyError> {
        let to = &layout.slaves()[owner].addr;
        let from = &layout.slaves()[source.slave].addr;
        let mut copied = Copied::default();
        let mut done = 0;
        while done < source.vids.len() {
            let rest = &source.vids[done..];
            let asked = &rest[..rest.len().min(wire::MAX_FETCH_VIDS as usize)];
            let mut stale = 0;
            let answered = loop {
                let write = self.fence.write_number().await.map_err(CopyError::Send)?;
                let response = self
                    .pool
                    .call(to, self.options.import_timeout, |client| {
                        let mut request = client.pull_request();
                        self.stamp(
                            request.get().init_stamp(),
                            self.slaves.session(owner),
                            write,
                            0,
                        );
                        request
                            .get()
                            .set_from_session(self.slaves.session(source.slave));
                        request.get().set_from(from.as_str());
                        request.get().set_vids(bytemuck::cast_slice(asked));
                        request.get().set_max_bytes(ROUND_BYTES);
                        request.send().promise
                    })
                    .await
                    .map_err(CopyError::Send)?;
                match self.read_pulled(&response, owner, source.slave, asked.len(), &mut copied)? {
                    Some(answered) => break answered,
                    // Overtaken by the round of another source, stamped later.
                    None if stale < MAX_STALE => stale += 1,
                    None => {
                        return Err(CopyError::Send(format!(
                            "it refused {MAX_STALE} rounds of copies as older than what it \
                             applied"
                        )));
                    }
                }
            };
            done += answered;
        }
        Ok(copied)
    }

    /// What a `pull` by slave `owner` of `asked` vids from slave `source`
    /// did: adds what it copied to `copied` and returns how many vids it
    /// answered, or `None` when it stored nothing because a later-stamped
    /// round overtook this one.
    fn read_pulled(
        &self,
        response: &Response<slave::pull_results::Owned>,
        owner: usize,
        source: usize,
        asked: usize,
        copied: &mut Copied,
    ) -> Result<Option<usize>, CopyError> {
        let malformed =
            |e: capnp::Error| CopyError::Send(format!("it answered a malformed message: {e}"));
        let reply = response.get().map_err(malformed)?;
        match reply
            .get_outcome()
            .and_then(|o| Ok(o.which()?))
            .map_err(malformed)?
        {
            pull_outcome::Done(()) => {}
            pull_outcome::SourceFailed(reason) => {
                let reason = reason
                    .and_then(|r| Ok(r.to_string()?))
                    .unwrap_or_else(|e| format!("a malformed reason: {e}"));
                self.mark_down(source, &reason);
                return Err(CopyError::Fetch(self.unavailable(
                    format!("vectors to copy could not be read: {reason}"),
                    &[source],
                )));
            }
            pull_outcome::StoreFailed(reason) | pull_outcome::Refused(reason) => {
                return Err(CopyError::Send(slave_said(reason)));
            }
            pull_outcome::Stale(_) => return Ok(None),
        }
        self.saw_applied(owner, reply.get_state());
        let answered = reply.get_answered() as usize;
        if answered == 0 || answered > asked {
            return Err(CopyError::Send(format!(
                "it pulled {answered} of the {asked} vids asked"
            )));
        }
        copied.vectors += reply.get_vectors();
        copied.bytes += reply.get_bytes();
        Ok(Some(answered))
    }
}

/// The outcome of an `update` call: the vids the slave changed.
pub(super) fn read_changed(
    response: &Response<slave::update_results::Owned>,
) -> Result<Vec<u64>, String> {
    let malformed = |e: capnp::Error| format!("it answered a malformed message: {e}");
    let result = response
        .get()
        .and_then(|r| r.get_result())
        .and_then(|r| Ok(r.which()?))
        .map_err(malformed)?;
    match result {
        change_result::Changed(bytes) => {
            let vids =
                wire::vids(bytes.map_err(malformed)?).map_err(|e| format!("it answered {e}"))?;
            Ok(vids.into_owned())
        }
        change_result::Error(text) | change_result::Refused(text) => Err(slave_said(text)),
    }
}
