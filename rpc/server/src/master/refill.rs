//! Re-replication (docs/protocol.md §9): a slave that comes back without
//! some of the vectors it owns (a wiped data directory, a new disk or
//! machine, a store restored from a backup) is not asked for them, and gets
//! them back from their other owners in the background.
//!
//! When a slave's catalog is merged (`probe`), the master compares it with
//! what the slave owns: the vids it lacks (every one it owns, when its store
//! was `replaced`) are kept per slave and excluded when planning queries, so
//! the slave neither flaps nor answers empty for them. The refill copies
//! each lacking vector from a live owner that holds it, exactly as it is (a
//! `replace`), under the write lock, so no write falls between the read and
//! the copy. With no other copy (for
//! example `replicas = 1`), the vector stays lacking and queries needing it
//! are `unavailable`, never answered without it.

use std::collections::BTreeSet;
use std::rc::Rc;

use crate::chain::VidRun;

use super::copy::CopyError;
use super::{Master, missed};

/// The most vectors copied to a slave in one call.
const REFILL_BATCH: usize = 256;

/// Refills slaves that lack vectors, forever.
pub(super) async fn refill_loop(master: Rc<Master>) {
    loop {
        tokio::time::sleep(master.options.probe_interval).await;
        for index in 0..master.layout().slaves().len() {
            while master.refill(index).await > 0 {}
        }
    }
}

impl Master {
    /// Notes which vectors slave `index` owns but does not hold (`held`:
    /// every vid it holds, ascending). Those noted before (missed when its
    /// store was replaced) stay noted until they are copied back.
    pub(super) fn note_lacking(&self, index: usize, held: &[u64]) {
        let layout = self.layout();
        let noted = self.slaves.take_lacking(index);
        let catalog = self.records.catalog();
        let lacking: BTreeSet<u64> = catalog
            .range(0, u64::MAX)
            .filter(|&v| held.binary_search(&v).is_err() && layout.read_owners(v).contains(&index))
            .chain(
                noted
                    .into_iter()
                    .filter(|&v| catalog.contains(v) && layout.write_owners(v).contains(&index)),
            )
            .collect();
        drop(catalog);
        if !lacking.is_empty() {
            tracing::warn!(
                "slave {} lacks {} of the vectors it owns: they are served by their other \
                 owners and copied back to it",
                self.slave_name(index),
                lacking.len()
            );
        }
        self.slaves.note_lacking(index, lacking);
    }

    /// Records durably which vectors each slave missed writes to, as they
    /// are now.
    pub(super) async fn record_missed(&self) -> Result<(), String> {
        let write = missed::write(
            self.records.catalog().directory().clone(),
            self.layout().slaves(),
            &self.slaves.missed(),
        );
        write
            .persist()
            .await
            .map_err(|e| format!("the master could not record which owners missed a write: {e}"))
    }

    /// Whether slave `index` may serve vector `vid` to a query now.
    pub(super) fn serves(&self, index: usize, vid: u64) -> bool {
        self.serving()(index, VidRun::one(vid))
    }

    /// Whether slave `index` may serve every vector of a run to a query
    /// now, for many questions in a row (a plan asks one per run of vids):
    /// it holds them ([`Slaves::holding`](super::slaves::Slaves::holding)) and, for the vectors of the write
    /// being applied, it is their primary owner. Owners apply a write one
    /// after another, so two queries reading one vector from two owners
    /// meanwhile could see it written, then not; read from one owner, a
    /// vector only ever goes from before the write to after it.
    pub(super) fn serving(&self) -> impl Fn(usize, VidRun) -> bool + '_ {
        let holding = self.slaves.holding();
        let writing = self.records.writing();
        let layout = self.layout();
        move |index, run| {
            holding(index, run)
                && writing
                    .range(run.vids())
                    .all(|&vid| layout.read_owners(vid).first() == Some(&index))
        }
    }

    /// Copies up to [`REFILL_BATCH`] of the vectors slave `index` lacks from
    /// their other owners; returns how many it copied.
    async fn refill(&self, index: usize) -> usize {
        if !self.slaves.is_up(index) || self.slaves.lacking(index).is_empty() {
            return 0;
        }
        let _writing = self.records.lock().await;
        self.refill_held(index).await
    }

    /// [`Master::refill`], the caller holding the write lock.
    pub(super) async fn refill_held(&self, index: usize) -> usize {
        if !self.slaves.is_up(index) || self.slaves.lacking(index).is_empty() {
            return 0;
        }
        let layout = self.layout();
        // Those another owner holds; the others wait (or are lost).
        let vids: Vec<u64> = {
            let holding = self.slaves.holding();
            self.slaves
                .lacking(index)
                .iter()
                .copied()
                .filter(|&vid| {
                    layout
                        .read_owners(vid)
                        .into_iter()
                        .any(|o| holding(o, VidRun::one(vid)))
                })
                .take(REFILL_BATCH)
                .collect()
        };
        if vids.is_empty() {
            return 0;
        }
        match self.copy_vectors(&layout, index, &vids).await {
            Ok(_) => {}
            Err(CopyError::Fetch(failure)) => {
                tracing::warn!("refilling {}: {}", self.slave_name(index), failure.message);
                return 0;
            }
            Err(CopyError::Send(reason)) => {
                self.mark_down(index, &format!("copying vectors back to it: {reason}"));
                return 0;
            }
        }
        let copied = self.slaves.copied_back(index, &vids);
        if copied.whole {
            tracing::info!(
                "slave {} holds every vector it owns again",
                self.slave_name(index)
            );
        }
        if copied.record
            && let Err(reason) = self.record_missed().await
        {
            tracing::warn!("{reason}");
        }
        vids.len()
    }
}
