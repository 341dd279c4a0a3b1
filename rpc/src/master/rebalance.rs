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

use std::collections::BTreeMap;
use std::rc::Rc;

use capnp::capability::{Promise, Response};

use super::Master;
use super::layout::Layout;
use super::recorded::{self, Move};
use super::reply::Failure;
use super::slaves::SlaveState;
use crate::bitfold_capnp::{Want, change_result, fetch_result, slave};
use crate::client::ErrorKind;
use crate::cluster::ClusterConfig;

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
        let _writing = self.writes.lock().await;
        let layout = self.layout();
        let target = match &layout.target {
            Some(target) => target.clone(),
            None => match self.start_move(&layout)? {
                Some(target) => {
                    // The slaves it adds take writes from now on: contact them.
                    let new = layout.slaves().len()..target.slaves.len();
                    futures::future::join_all(new.map(|i| self.probe(i))).await;
                    target
                }
                None => {
                    return Ok(Progress {
                        done: self.catalog.borrow().len() as u64,
                        total: self.catalog.borrow().len() as u64,
                        finished: true,
                        ..Progress::default()
                    });
                }
            },
        };
        let layout = self.layout();
        let next = self.move_next.get();
        let vids: Vec<u64> = self
            .catalog
            .borrow()
            .range(next, u64::MAX)
            .take(most)
            .collect();
        let mut progress = self.copy_to_new_owners(&layout, &target, &vids).await?;
        let total = self.catalog.borrow().len() as u64;
        progress.total = total;
        if vids.len() == most
            && let Some(&last) = vids.last()
        {
            let next = last.saturating_add(1);
            self.move_next.set(next);
            let moving = Move { next, target };
            self.record(|dir| recorded::record_move(dir, &moving))?;
            progress.done = self.catalog.borrow().range(0, last).count() as u64 + 1;
            return Ok(progress);
        }
        progress.removed = self.finish_move(&layout, target).await?;
        progress.done = total;
        progress.finished = true;
        Ok(progress)
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
        self.move_next.set(0);
        self.install(Layout {
            current: layout.current.clone(),
            target: Some(target.clone()),
        });
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
            let copies = self.fetch_copies(layout, &vids).await?;
            progress.copied_bytes += copies
                .iter()
                .map(|(_, r)| {
                    r.get()
                        .map_or(0, |r| r.total_size().map_or(0, |s| s.word_count * 8))
                })
                .sum::<u64>();
            self.send_copies(owner, &copies).await.map_err(|reason| {
                self.mark_down(owner, &reason);
                self.unavailable(
                    format!(
                        "the move could not copy vectors to {}",
                        self.slave_name(owner)
                    ),
                    &[owner],
                )
            })?;
            progress.copied += copies.len() as u64;
        }
        Ok(progress)
    }

    /// Fetches each of `vids` from an owner that serves it.
    pub(super) async fn fetch_copies(
        &self,
        layout: &Layout,
        vids: &[u64],
    ) -> Result<Vec<(u64, Response<slave::fetch_results::Owned>)>, Failure> {
        let fetches = vids.iter().map(|&vid| async move {
            let owners = layout.read_owners(vid);
            let Some(source) = owners.iter().copied().find(|&o| self.serves(o, vid)) else {
                return Err(self.unavailable(
                    format!("no live owner holds vector {vid} to copy it from"),
                    &owners,
                ));
            };
            let addr = &layout.slaves()[source].addr;
            self.pool
                .call(addr, self.options.rpc_timeout, |client| {
                    let mut request = client.fetch_request();
                    request.get().set_vid(vid);
                    request.get().set_want(Want::Vector);
                    request.send().promise
                })
                .await
                .map(|response| (vid, response))
                .map_err(|reason| {
                    self.mark_down(source, &reason);
                    self.unavailable(format!("vector {vid} could not be read"), &[source])
                })
        });
        futures::future::join_all(fetches)
            .await
            .into_iter()
            .collect()
    }

    /// Replaces each vector of `copies` on slave `owner` by its copy.
    pub(super) async fn send_copies(
        &self,
        owner: usize,
        copies: &[(u64, Response<slave::fetch_results::Owned>)],
    ) -> Result<(), String> {
        let addr = self.layout().slaves()[owner].addr.clone();
        let response = self
            .pool
            .call(&addr, self.options.import_timeout, |client| {
                write_copies(client, copies)
            })
            .await?;
        read_changed(&response)
    }

    /// Makes `target` the layout queries read from, then deletes the copies
    /// no longer owned; returns how many it deleted.
    async fn finish_move(&self, old: &Layout, target: ClusterConfig) -> Result<u64, Failure> {
        self.record(|dir| recorded::record(dir, &target))?;
        self.install(Layout {
            current: target.clone(),
            target: Some(target.clone()),
        });
        // Queries planned on the old layout may still read the old copies.
        self.in_flight.drain().await;
        let mut surplus: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for vid in self.catalog.borrow().range(0, u64::MAX) {
            let kept = target.placement().owners(vid);
            for owner in old.read_owners(vid) {
                if !kept.contains(&owner) {
                    surplus.entry(owner).or_default().push(vid);
                }
            }
        }
        let mut removed = 0;
        for (owner, vids) in surplus {
            match self.send_deletes(old, owner, &vids).await {
                Ok(()) => removed += vids.len() as u64,
                Err(reason) => tracing::warn!(
                    "{} keeps {} copies it no longer owns ({reason}); they are never read",
                    old.slaves()[owner].name,
                    vids.len()
                ),
            }
        }
        self.record(recorded::end_move)?;
        self.install(Layout {
            current: target,
            target: None,
        });
        Ok(removed)
    }

    /// Deletes `vids` on slave `owner` of `layout`.
    async fn send_deletes(
        &self,
        layout: &Layout,
        owner: usize,
        vids: &[u64],
    ) -> Result<(), String> {
        let addr = &layout.slaves()[owner].addr;
        let response = self
            .pool
            .call(addr, self.options.import_timeout, |client| {
                let mut request = client.update_request();
                let mut list = request.get().init_changes(vids.len() as u32);
                for (i, &vid) in vids.iter().enumerate() {
                    let mut change = list.reborrow().get(i as u32);
                    change.set_vid(vid);
                    change.set_delete(());
                }
                request.send().promise
            })
            .await?;
        read_changed(&response)
    }

    /// Installs `layout`, growing or shrinking the per-slave state to its
    /// slaves; a slave at a new address is a new machine, not contacted yet.
    fn install(&self, layout: Layout) {
        let old = self.layout();
        let mut states = self.slaves.borrow_mut();
        states.resize(layout.slaves().len(), SlaveState::unknown());
        for (i, slave) in layout.slaves().iter().enumerate() {
            if old
                .slaves()
                .get(i)
                .is_some_and(|was| was.addr != slave.addr)
            {
                states[i] = SlaveState::unknown();
            }
        }
        self.lacking
            .borrow_mut()
            .resize(layout.slaves().len(), Default::default());
        *self.layout.borrow_mut() = Rc::new(layout);
    }

    /// Writes one of the master's records, or says it could not.
    fn record(
        &self,
        write: impl FnOnce(
            &dyn bitfold_engine::store::Directory,
        ) -> Result<(), bitfold_engine::store::StoreError>,
    ) -> Result<(), Failure> {
        write(&**self.catalog.borrow().directory())
            .map_err(|e| Failure::internal(format!("the master could not record the move: {e}")))
    }
}

/// The `update` call replacing each vector of `copies` by the copy fetched.
pub(super) fn write_copies(
    client: slave::Client,
    copies: &[(u64, Response<slave::fetch_results::Owned>)],
) -> Promise<Response<slave::update_results::Owned>, capnp::Error> {
    let mut request = client.update_request();
    let mut list = request.get().init_changes(copies.len() as u32);
    for (i, (vid, response)) in copies.iter().enumerate() {
        let mut change = list.reborrow().get(i as u32);
        change.set_vid(*vid);
        let copied = response
            .get()
            .and_then(|r| r.get_result())
            .and_then(|r| Ok(r.which()?))
            .and_then(|result| match result {
                fetch_result::Vector(parts) => change.set_replace(parts?),
                // Deleted since it was listed: nothing to copy.
                fetch_result::NotFound(()) => {
                    change.set_delete(());
                    Ok(())
                }
                fetch_result::Count(_) => Err(capnp::Error::failed("a count came back".into())),
            });
        if let Err(err) = copied {
            return Promise::err(err);
        }
    }
    Promise::from_future(request.send().promise)
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
