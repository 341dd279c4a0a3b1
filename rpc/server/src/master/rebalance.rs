//! Moving vectors to a new layout (docs/protocol.md §9), online: `bitfold
//! rebalance` calls [`Master::rebalance_step`] until the move is finished.
//!
//! The first step re-reads the cluster file, checks that its edit of the
//! recorded layout is allowed, and records the move (`move.toml`): from
//! then on every write goes to the owners under both layouts, while queries
//! go on reading from the current owners. Each step then copies the next
//! vectors of the catalog (in vid order) to the owners they gain, exactly as
//! they are (a `replace`), under the write lock so that no write falls
//! between the read and the copy, and records how far it got: an
//! interrupted move resumes there. Once every vector has been copied, the
//! target becomes the recorded layout and queries read from it; after the
//! queries planned before that have finished, the surplus copies are
//! deleted. Slaves removed from the end of the file may be stopped then.
//!
//! A move is finished only once the cluster is whole: each step after the
//! last copy also copies back vectors slaves lack (a wiped or new disk),
//! and the move reports finished only when every vector has `replicas`
//! copies that may serve; when that cannot happen (an owner down, a vector
//! no live owner holds) the step is an `unavailable` error saying why.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::Master;
use super::copy::{CopyError, read_changed};
use super::layout::Layout;
use super::probe::Writes;
use super::recorded::{self, Move};
use super::reply::Failure;
use crate::cluster::ClusterConfig;
use crate::wire;
use bitfold_proto::ErrorKind;

/// What a step did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Progress {
    pub(super) done: u64,
    pub(super) total: u64,
    pub(super) copied: u64,
    pub(super) copied_bytes: u64,
    pub(super) removed: u64,
    pub(super) finished: bool,
}

impl Master {
    /// Moves up to `most` vectors towards the cluster file's layout.
    pub(super) async fn rebalance_step(&self, most: usize) -> Result<Progress, Failure> {
        let _writing = self.records.lock().await;
        let layout = self.layout();
        let target = match &layout.target {
            Some(target) => target.clone(),
            None => match self.start_move(&layout)? {
                Some(target) => {
                    // The slaves it adds take writes from now on: contact them.
                    let new = layout.slaves().len()..target.slaves.len();
                    futures::future::join_all(new.map(|i| self.probe(i, Writes::Held))).await;
                    target
                }
                None => {
                    let total = self.records.catalog().len() as u64;
                    let mut progress = Progress {
                        done: total,
                        total,
                        ..Progress::default()
                    };
                    self.make_whole(&mut progress).await?;
                    return Ok(progress);
                }
            },
        };
        let layout = self.layout();
        let next = self.placement.move_next();
        let vids: Vec<u64> = self
            .records
            .catalog()
            .range(next, u64::MAX)
            .take(most)
            .collect();
        let mut progress = self.copy_to_new_owners(&layout, &target, &vids).await?;
        let total = self.records.catalog().len() as u64;
        progress.total = total;
        if vids.len() == most
            && let Some(&last) = vids.last()
        {
            let next = last.saturating_add(1);
            self.placement.copied_before(next);
            let moving = Move { next, target };
            self.record(|dir| recorded::record_move(dir, &moving))?;
            progress.done = self.records.catalog().range(0, last).count() as u64 + 1;
            return Ok(progress);
        }
        progress.removed = self.finish_move(&layout, target).await?;
        progress.done = total;
        self.make_whole(&mut progress).await?;
        Ok(progress)
    }

    /// Copies back a round of the vectors slaves lack, and says whether
    /// every vector now has `replicas` copies that may serve (`finished`);
    /// an error when none could be copied and some vectors still lack copies.
    async fn make_whole(&self, progress: &mut Progress) -> Result<(), Failure> {
        self.probe_round(Writes::Held).await;
        let slaves = self.layout().slaves().len();
        let mut copied = 0;
        for index in 0..slaves {
            copied += self.refill_held(index).await as u64;
        }
        progress.copied += copied;
        let standing = self.standing();
        let (under, machines) = (standing.under, Vec::from_iter(standing.idle));
        progress.finished = under == 0;
        if under > 0 && copied == 0 {
            return Err(self.unavailable(
                format!(
                    "{under} vectors have fewer than {} copies that may serve, and none could \
                     be copied now; run `bitfold rebalance` again once the slaves are up",
                    self.layout().current.replicas
                ),
                &machines,
            ));
        }
        Ok(())
    }

    /// Reads the cluster file and, when it asks for another layout, records
    /// the move and installs it; `None` when there is nothing to move.
    fn start_move(&self, layout: &Layout) -> Result<Option<ClusterConfig>, Failure> {
        let file = match &self.options.cluster_file {
            Some(path) => ClusterConfig::load(path)
                .map_err(|e| Failure::new(ErrorKind::Internal, e.to_string()))?,
            None => self.options.cluster.clone(),
        };
        let target = recorded::target(&layout.current, &file)
            .map_err(|e| Failure::new(ErrorKind::Internal, e))?;
        if target == layout.current {
            return Ok(None);
        }
        let moving = Move {
            next: 0,
            target: target.clone(),
        };
        self.record(|dir| recorded::record_move(dir, &moving))?;
        self.relayout(|placement| placement.begin_move(target.clone()));
        tracing::info!(
            "moving vectors from {} slaves with {} replicas to {} slaves with {} replicas",
            layout.current.slaves.len(),
            layout.current.replicas,
            target.slaves.len(),
            target.replicas
        );
        Ok(Some(target))
    }

    /// Copies each of `vids` to the owners it has under `target` but not
    /// under the current layout.
    async fn copy_to_new_owners(
        &self,
        layout: &Layout,
        target: &ClusterConfig,
        vids: &[u64],
    ) -> Result<Progress, Failure> {
        let mut to: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for &vid in vids {
            let now = layout.read_owners(vid);
            for owner in target.placement().owners(vid) {
                if !now.contains(&owner) {
                    to.entry(owner).or_default().push(vid);
                }
            }
        }
        let mut progress = Progress::default();
        for (owner, vids) in to {
            // Written to only once checked (a slave added or back since).
            if !self.slaves.is_up(owner) {
                self.probe(owner, Writes::Held).await;
            }
            let copied =
                self.copy_vectors(layout, owner, &vids)
                    .await
                    .map_err(|err| match err {
                        CopyError::Fetch(failure) => failure,
                        CopyError::Send(reason) => {
                            self.mark_down(owner, &reason);
                            self.unavailable(
                                format!(
                                    "the move could not copy vectors to {}: {reason}",
                                    self.slave_name(owner)
                                ),
                                &[owner],
                            )
                        }
                    })?;
            progress.copied += copied.vectors;
            progress.copied_bytes += copied.bytes;
        }
        Ok(progress)
    }

    /// Makes `target` the layout queries read from, then deletes the copies
    /// no longer owned; returns how many it deleted.
    async fn finish_move(&self, old: &Layout, target: ClusterConfig) -> Result<u64, Failure> {
        // The sessions of the old layout's slaves, those it removes among them.
        let sessions: Vec<u64> = (0..old.slaves().len())
            .map(|i| self.slaves.session(i))
            .collect();
        let sessions = &sessions;
        self.record(|dir| recorded::record(dir, &target))?;
        self.relayout(|placement| placement.read_from_target(target.clone()));
        // Queries planned on the old layout may still read the old copies.
        self.in_flight.drain().await;
        let mut surplus: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for vid in self.records.catalog().range(0, u64::MAX) {
            let kept = target.placement().owners(vid);
            for owner in old.read_owners(vid) {
                if !kept.contains(&owner) {
                    surplus.entry(owner).or_default().push(vid);
                }
            }
        }
        tracing::info!(
            "every vector is copied and read under the new layout; removing the copies no \
             owner needs from {} slaves",
            surplus.len()
        );
        let deletes = surplus.iter().map(|(&owner, vids)| async move {
            let session = sessions[owner];
            (
                owner,
                vids,
                self.send_deletes(old, owner, session, vids).await,
            )
        });
        let mut removed = 0;
        for (owner, vids, deleted) in futures::future::join_all(deletes).await {
            match deleted {
                Ok(()) => removed += vids.len() as u64,
                Err(reason) => {
                    tracing::warn!(
                        "{} keeps {} copies it no longer owns ({reason}); they are never \
                         read, and are deleted once it answers again",
                        old.slaves()[owner].name,
                        vids.len()
                    );
                    // Down, it is read again (catalog and all) before it is
                    // used, and its surplus deleted then.
                    if owner < self.layout().slaves().len() {
                        self.mark_down(owner, &reason);
                    }
                }
            }
        }
        self.record(recorded::end_move)?;
        self.relayout(|placement| placement.end_move(target));
        // A slave marked down that has taken copies since (restarted during
        // the move) is up: know it now rather than at the next probe, so
        // that its vectors answer as soon as the move is reported finished.
        self.probe_round(Writes::Held).await;
        Ok(removed)
    }

    /// Deletes `vids` on slave `owner` of `layout` (its process `session`),
    /// as one write in pieces.
    pub(super) async fn send_deletes(
        &self,
        layout: &Layout,
        owner: usize,
        session: u64,
        vids: &[u64],
    ) -> Result<(), String> {
        let addr = &layout.slaves()[owner].addr;
        let write = self.fence.write_number().await?;
        for (piece, vids) in vids.chunks(wire::MAX_UPDATE_CHANGES as usize).enumerate() {
            let response = self
                .pool
                .call(addr, self.options.import_timeout, |client| {
                    let mut request = client.update_request();
                    self.stamp(request.get().init_stamp(), session, write, piece as u64);
                    let piece = vids;
                    let mut list = request.get().init_changes(piece.len() as u32);
                    for (i, &vid) in piece.iter().enumerate() {
                        let mut change = list.reborrow().get(i as u32);
                        change.set_vid(vid);
                        change.set_delete(());
                    }
                    request.send().promise
                })
                .await?;
            read_changed(&response)?;
            self.saw_write_applied(owner, write, response.get().and_then(|r| r.get_state()))?;
        }
        Ok(())
    }

    /// Takes one step of the move (`step` returns the layout it replaced)
    /// and fits the per-slave state to the layout in force after it: the
    /// one place a layout changes.
    fn relayout(&self, step: impl FnOnce(&super::layout::Placement) -> Rc<Layout>) {
        let replaced = step(&self.placement);
        self.slaves.fit(&replaced, &self.layout());
    }

    /// Writes one of the master's records, or says it could not.
    fn record(
        &self,
        write: impl FnOnce(
            &dyn bitfold_engine::store::Directory,
        ) -> Result<(), bitfold_engine::store::StoreError>,
    ) -> Result<(), Failure> {
        write(&**self.records.catalog().directory())
            .map_err(|e| Failure::internal(format!("the master could not record the move: {e}")))
    }
}
