//! Probing slaves, checking their stores and merging their catalogs: a down
//! slave is asked for its health every [`super::MasterOptions::probe_interval`]
//! and used again once it answers, its store is checked against the ledger,
//! it has caught up on the writes it missed and the vids it holds are in
//! the master's catalog.
//!
//! A slave answering from a process the master has not checked yet (a
//! restart, perhaps onto a wiped disk, a new machine or a restored backup)
//! is taken down and checked: a store the ledger does not name for it, or
//! one that has applied fewer writes than the master saw it apply, holds
//! nothing it may serve. Every vector it owns is noted as missed there,
//! durably (`missed-writes`), before the ledger names its new store, and
//! copied back to it (`refill`) before it serves it.

use std::rc::Rc;
use std::time::SystemTime;

use tokio::sync::MutexGuard;

use super::Master;
use super::ledger::KnownStore;
use super::records::Records;
use super::slaves::Holdings;
use crate::bitfold_capnp::master;

/// Probes the slaves that need it, forever.
pub(super) async fn probe_loop(master: Rc<Master>) {
    loop {
        tokio::time::sleep(master.options.probe_interval).await;
        master.probe_round(Writes::Take).await;
        master.record_applied().await;
    }
}

/// Who a slave said it is, in a health answer.
#[derive(Debug, Clone, Copy)]
struct Seen {
    store: u64,
    session: u64,
    applied: u64,
}

/// Whether the caller of a probe holds the master's write lock: a slave
/// that missed updates is caught up under it, so a caller that holds it
/// (a move adding or finding slaves) must say so, or the probe waits on it
/// forever.
#[derive(Clone, Copy)]
pub(super) enum Writes {
    /// Take the lock to catch a slave up.
    Take,
    /// The caller holds it.
    Held,
    /// Take it only if it is free: a query must not wait for a write, which
    /// may itself be waiting for the queries in flight to end. A slave that
    /// needs the lock then stays down until a later probe.
    Try,
}

impl Writes {
    /// The write lock of `records`, taken unless the caller holds it
    /// already; `None` when it is busy and the caller only tries.
    async fn hold(self, records: &Records) -> Option<Option<MutexGuard<'_, ()>>> {
        match self {
            Writes::Take => Some(Some(records.lock().await)),
            Writes::Held => Some(None),
            Writes::Try => records.try_lock().ok().map(Some),
        }
    }
}

impl Master {
    /// Probes every slave that is down or whose catalog is not merged yet.
    pub(super) async fn probe_round(&self, writes: Writes) {
        let pending = self.slaves.unsettled();
        futures::future::join_all(pending.into_iter().map(|i| self.probe(i, writes))).await;
    }

    /// Asks slave `index` for its health (and its catalog, when it was not
    /// merged since the slave came up) and records what it says.
    pub(super) async fn probe(&self, index: usize, writes: Writes) {
        let addr = self.layout().slaves()[index].addr.clone();
        let timeout = self.options.health_timeout();
        let health = self
            .pool
            .call(&addr, timeout, |client| {
                client.health_request().send().promise
            })
            .await;
        let response = match health {
            Ok(response) => response,
            Err(reason) => return self.mark_down(index, &reason),
        };
        let counts = response.get().map(|h| Holdings {
            vectors: h.get_vectors(),
            bytes: h.get_bytes(),
            read_bytes: h.get_read_bytes(),
            sent_bytes: h.get_sent_bytes(),
            certificate_not_after: h.get_certificate_not_after(),
        });
        let seen = response.get().and_then(|h| h.get_state()).map(|s| Seen {
            store: s.get_store(),
            session: s.get_session(),
            applied: s.get_write(),
        });
        let (Ok(holdings), Ok(seen)) = (counts, seen) else {
            return self.mark_down(index, "it answered health with a malformed message");
        };
        self.slaves.report(index, holdings);
        if seen.session != self.slaves.session(index)
            && let Err(reason) = self.check_store(index, seen).await
        {
            return self.mark_down(index, &reason);
        }
        let synced = self.slaves.states()[index].synced;
        if !synced {
            // Updates it missed first: merging its catalog before would
            // bring back the vectors it has not deleted yet.
            if !self.records.journal().waiting_for(index).is_empty() {
                let Some(_writing) = writes.hold(&self.records).await else {
                    return;
                };
                if let Err(reason) = self.catch_up(index).await {
                    return self.mark_down(index, &format!("catching up on updates: {reason}"));
                }
            }
            let held = match self.sync_catalog(index, &addr).await {
                Ok(held) => held,
                Err(reason) => return self.mark_down(index, &reason),
            };
            match self.drop_surplus(index, &held, writes).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(reason) => return self.mark_down(index, &reason),
            }
            self.note_lacking(index, &held);
        }
        if self.slaves.come_up(index) {
            tracing::info!("slave {} is up", self.slave_name(index));
            self.metrics
                .transition(&self.layout().slaves()[index].name, true);
        }
    }

    /// Checks the store of a slave process the master has not checked yet
    /// (`seen`) against what the ledger and this master know of slave
    /// `index`: the same store, having applied every write the master saw
    /// it apply, is trusted again; any other has missed every write to the
    /// vectors it owns (noted, durably, before the ledger records the new
    /// store). The first store a slave is ever seen with is recorded. Until
    /// the check is done the slave is down.
    async fn check_store(&self, index: usize, seen: Seen) -> Result<(), String> {
        let name = self.layout().slaves()[index].name.clone();
        self.mark_down(index, "a new process there: its store is being checked");
        let known = self.fence.store(&name);
        let replaced = {
            let state = &self.slaves.states()[index];
            let saw = if state.store == seen.store {
                state.applied
            } else {
                0
            };
            match known {
                None => false,
                Some(known) => known.store != seen.store || seen.applied < known.applied.max(saw),
            }
        };
        self.slaves
            .checked(index, seen.session, seen.store, seen.applied);
        if replaced {
            tracing::warn!(
                "slave {} holds another store than the one that held its vectors (a wiped or \
                 new disk, or one restored from a backup): it serves none of them until each \
                 is copied back to it",
                self.slave_name(index)
            );
            let layout = self.layout();
            let owned: Vec<u64> = self
                .records
                .catalog()
                .range(0, u64::MAX)
                .filter(|&v| layout.read_owners(v).contains(&index))
                .collect();
            self.slaves.note_missed(index, owned);
            self.record_missed().await?;
        }
        if replaced || known.is_none() {
            let known = KnownStore {
                store: seen.store,
                applied: seen.applied,
            };
            self.know_store(&name, known).await?;
        }
        Ok(())
    }

    /// Records durably in the ledger that slave `name` holds store `known`.
    async fn know_store(&self, name: &str, known: KnownStore) -> Result<(), String> {
        if !self.fence.know(name, known) {
            return Ok(());
        }
        self.fence
            .record()
            .await
            .map_err(|e| format!("the master could not record its store: {e}"))
    }

    /// Records in the ledger the writes each checked slave's store has
    /// applied, as far as the master saw: a store restored from an older
    /// backup is then told apart after a restart of the master too.
    async fn record_applied(&self) {
        let layout = self.layout();
        let mut record = false;
        for (index, entry) in layout.slaves().iter().enumerate() {
            let (store, applied) = {
                let state = &self.slaves.states()[index];
                (state.store, state.applied)
            };
            let known = self.fence.store(&entry.name);
            if known.is_none_or(|k| k.store != store || k.applied >= applied) {
                continue;
            }
            record |= self.fence.know(&entry.name, KnownStore { store, applied });
        }
        if record && let Err(e) = self.fence.record().await {
            tracing::warn!("the master could not record the writes its slaves applied: {e}");
        }
    }

    /// Merges into the catalog (durably) the vids slave `index` (at `addr`)
    /// holds and owns under the layout queries read; returns every vid it
    /// holds, ascending.
    ///
    /// Only what it owns for reading: a copy it holds otherwise is either
    /// one a move could not delete while it was down, or one it kept from
    /// before a move took it out of the cluster and now adds it back; such
    /// a copy may be of a vector deleted since, which taken into the
    /// catalog would come back, its owners asked for what they rightly
    /// lack. (A vector being copied to it by a move is on its other owners.)
    async fn sync_catalog(&self, index: usize, addr: &str) -> Result<Vec<u64>, String> {
        let response = self
            .pool
            .call(addr, self.options.rpc_timeout, |client| {
                client.catalog_request().send().promise
            })
            .await?;
        let vids = response
            .get()
            .and_then(|r| r.get_vids())
            .map_err(|e| format!("its catalog is malformed: {e}"))?;
        if !vids.len().is_multiple_of(8) {
            return Err("its catalog is malformed: not a whole number of vids".into());
        }
        let vids: Vec<u64> = vids
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        if !vids.is_sorted() {
            return Err("its catalog is malformed: the vids are not ascending".into());
        }
        let layout = self.layout();
        let owned = vids
            .iter()
            .copied()
            .filter(|&vid| layout.read_owners(vid).contains(&index));
        self.records
            .insert(owned)
            .await
            .map_err(|e| format!("the master could not record its catalog: {e}"))?;
        Ok(vids)
    }

    /// Deletes from slave `index` the copies among `held` that nothing
    /// needs: those it owns under no layout in force (a move could not
    /// delete them while it was down), and, for a layout it is only moving
    /// to, those of vectors that no longer exist (kept from before a move
    /// took it out of the cluster). Never read, such a copy could still
    /// turn wrong: once the slave owns that vid again, an import of it
    /// would be ORed into the old bits. What it gains of existing vectors
    /// the move copies over. Returns whether it is done (not when the
    /// caller only tries the write lock and it is busy).
    async fn drop_surplus(
        &self,
        index: usize,
        held: &[u64],
        writes: Writes,
    ) -> Result<bool, String> {
        let needed = |layout: &super::layout::Layout, vid: u64| {
            layout.read_owners(vid).contains(&index)
                || (layout.write_owners(vid).contains(&index)
                    && self.records.catalog().contains(vid))
        };
        if held.iter().all(|&vid| needed(&self.layout(), vid)) {
            return Ok(true);
        }
        // Moves, imports and updates change both under the write lock:
        // what is surplus stays surplus while the deletes are sent.
        let Some(_writing) = writes.hold(&self.records).await else {
            return Ok(false);
        };
        let layout = self.layout();
        let surplus: Vec<u64> = held
            .iter()
            .copied()
            .filter(|&vid| !needed(&layout, vid))
            .collect();
        self.send_deletes(&layout, index, self.slaves.session(index), &surplus)
            .await
            .map_err(|reason| {
                format!(
                    "it holds {} copies nothing needs, which could not be deleted: {reason}",
                    surplus.len()
                )
            })?;
        tracing::info!(
            "slave {} held {} copies nothing needs (left while it was down or out of the \
             cluster); they are deleted",
            self.slave_name(index),
            surplus.len()
        );
        Ok(true)
    }

    /// Probes every slave, then writes what the master knows of each.
    pub(super) async fn status(&self, results: &mut master::StatusResults) {
        let all = 0..self.layout().slaves().len();
        futures::future::join_all(all.map(|i| self.probe(i, Writes::Take))).await;
        let slaves = self.slaves.states();
        let layout = self.layout();
        let mut list = results.get().init_slaves(slaves.len() as u32);
        for (i, (state, entry)) in slaves.iter().zip(layout.slaves()).enumerate() {
            let mut out = list.reborrow().get(i as u32);
            out.set_name(entry.name.as_str());
            out.set_addr(entry.addr.as_str());
            out.set_up(state.up);
            let since = state
                .since
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            out.set_since_unix_millis(since);
            out.set_vectors(state.holdings.vectors);
            out.set_bytes(state.holdings.bytes);
            out.set_read_bytes(state.holdings.read_bytes);
            out.set_sent_bytes(state.holdings.sent_bytes);
            out.set_reason(state.reason.as_deref().unwrap_or(""));
            out.set_certificate_not_after(state.holdings.certificate_not_after);
        }
        let own = crate::tls::Tls::not_after_seconds(self.options.tls.as_ref());
        results.get().set_certificate_not_after(own);
        if let Some(quorum) = &self.quorum {
            let standing = quorum.standing();
            let mut list = results.get().init_masters(standing.masters.len() as u32);
            for (i, member) in standing.masters.iter().enumerate() {
                let mut out = list.reborrow().get(i as u32);
                out.set_name(member.name.as_str());
                out.set_addr(member.addr.as_str());
                out.set_state(member.state);
                out.set_log_index(member.log_index);
                if member.state == "leader" {
                    out.set_applied(standing.applied);
                }
                out.set_term(standing.term);
                out.set_reason(member.reason.as_str());
            }
        }
    }
}
