//! The master's record of which vectors exist and of the writes not yet
//! applied everywhere: the catalog queries are planned from, the journal of
//! pending writes, and the lock every write holds.
//!
//! The catalog always takes in what a recorded write does to it: a start
//! takes in what the pending writes do ([`Records::recover`]), an import's
//! vids join it once the write is recorded, a delete's leave it before any
//! owner removes them. A write's owners are acknowledged in the journal only
//! once that is durable ([`Records::acknowledge`]).

use std::cell::{Ref, RefCell};
use std::collections::BTreeSet;

use capnp::message::{Builder, HeapAllocator};
use tokio::sync::futures::Notified;
use tokio::sync::{Mutex, MutexGuard, Notify, TryLockError};

use super::journal::{Journal, Write};
use crate::catalog::Catalog;

/// The catalog, the journal of pending writes, the write lock and the
/// vids of the write being applied.
pub(super) struct Records {
    catalog: RefCell<Catalog>,
    journal: RefCell<Journal>,
    /// Held by every write (import, update, catch-up, copy), one at a time.
    lock: Mutex<()>,
    /// The vids of the write being applied: until it is done, queries read
    /// them from their primary owner only (`serving`).
    writing: RefCell<BTreeSet<u64>>,
    /// Woken when a write's vids are no longer being applied.
    applied: Notify,
}

impl Records {
    /// The records read at a start.
    pub(super) fn new(catalog: Catalog, journal: Journal) -> Records {
        Records {
            catalog: RefCell::new(catalog),
            journal: RefCell::new(journal),
            lock: Mutex::new(()),
            writing: RefCell::default(),
            applied: Notify::new(),
        }
    }

    /// Takes into the catalog what the pending writes do to it: a master
    /// stopped between recording a write and the catalog's record of it
    /// would otherwise plan queries on vectors being deleted, or miss
    /// vectors an import created.
    pub(super) async fn recover(&self) -> Result<(), String> {
        let (added, deleted) = self.journal.borrow().catalog_changes()?;
        let failed = |e| format!("the catalog could not record a recorded write: {e}");
        self.insert(added).await.map_err(failed)?;
        self.remove(deleted).await.map(|_| ()).map_err(failed)
    }

    /// The vectors that exist.
    pub(super) fn catalog(&self) -> Ref<'_, Catalog> {
        self.catalog.borrow()
    }

    /// The writes not yet applied everywhere.
    pub(super) fn journal(&self) -> Ref<'_, Journal> {
        self.journal.borrow()
    }

    /// Records `vids` as existing, durably; how many were new.
    pub(super) async fn insert(
        &self,
        vids: impl IntoIterator<Item = u64>,
    ) -> Result<usize, bitfold_engine::store::StoreError> {
        Catalog::insert(&self.catalog, vids).await
    }

    /// Records that `vids` no longer exist, durably; how many existed.
    pub(super) async fn remove(
        &self,
        vids: impl IntoIterator<Item = u64>,
    ) -> Result<usize, bitfold_engine::store::StoreError> {
        Catalog::remove(&self.catalog, vids).await
    }

    /// Waits for the write lock.
    pub(super) async fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// The write lock, if it is free.
    pub(super) fn try_lock(&self) -> Result<MutexGuard<'_, ()>, TryLockError> {
        self.lock.try_lock()
    }

    /// Adds write `id` made of `changes` to the journal, waiting for
    /// `owners` (see [`Journal::record`]); the caller holds the write lock.
    pub(super) fn record(
        &self,
        id: u64,
        changes: Builder<HeapAllocator>,
        owners: BTreeSet<usize>,
    ) -> capnp::Result<Write> {
        self.journal.borrow_mut().record(id, changes, owners)
    }

    /// Forgets write `id` for `owners`: its record could not be made
    /// durable, so nothing applies it.
    pub(super) fn withdraw(&self, id: u64, owners: &[usize]) {
        self.journal.borrow_mut().forget(id, owners);
    }

    /// Records durably that `owners` applied write `id`, then forgets it
    /// for them.
    pub(super) async fn acknowledge(&self, id: u64, owners: &[usize]) -> Result<(), String> {
        let write = self
            .journal
            .borrow()
            .acknowledgement(id, owners)
            .map_err(|e| e.to_string())?;
        write
            .persist()
            .await
            .map_err(|e| format!("the master could not record that it was applied: {e}"))?;
        self.journal.borrow_mut().forget(id, owners);
        Ok(())
    }

    /// Makes `vids` the write being applied, until the pin is dropped.
    pub(super) fn pin(&self, vids: BTreeSet<u64>) -> Pinned<'_> {
        *self.writing.borrow_mut() = vids;
        Pinned(self)
    }

    /// Resolves once the write being applied now (if any) is done: create
    /// it before looking at [`Records::writing`], so that a write that ends
    /// in between still wakes it.
    pub(super) fn applied(&self) -> Notified<'_> {
        self.applied.notified()
    }

    /// The vids of the write being applied.
    pub(super) fn writing(&self) -> Ref<'_, BTreeSet<u64>> {
        self.writing.borrow()
    }
}

/// The vids of the write being applied ([`Records::pin`]), forgotten once
/// it is done, however it ends.
pub(super) struct Pinned<'m>(&'m Records);

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.0.writing.borrow_mut().clear();
        self.0.applied.notify_waiters();
    }
}
