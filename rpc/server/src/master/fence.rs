//! How the master addresses a slave it has checked (docs/slave-protocol.md S7):
//! every call names the slave process it checked (its session), and every
//! write carries the master's epoch and the write's number, which the
//! slave's fence orders writes by. What a slave answers of its store tells
//! the master how far its writes have reached it.

use std::cell::RefCell;

use bitfold_engine::store::StoreError;

use super::Master;
use super::ledger::{KnownStore, Ledger};
use crate::bitfold_capnp::{outcome, stamp, store_state};

/// The ledger as the master serves from it: the epoch its writes carry, the
/// write numbers it gives out (each block reserved durably before its first
/// number is used) and the stores it checked, recorded one record at a
/// time: two at once would write one file together, and an older one
/// finishing last would undo a newer.
pub(super) struct Fence {
    ledger: RefCell<Ledger>,
    /// Held while the ledger is recorded.
    recording: tokio::sync::Mutex<()>,
}

impl Fence {
    /// Serves from `ledger`, as a start left it.
    pub(super) fn new(ledger: Ledger) -> Fence {
        Fence {
            ledger: RefCell::new(ledger),
            recording: tokio::sync::Mutex::new(()),
        }
    }

    /// This master's epoch.
    pub(super) fn epoch(&self) -> u64 {
        self.ledger.borrow().epoch()
    }

    /// A new write number (the ledger's next block recorded first, when
    /// this one starts it); an error says the master could not record it.
    pub(super) async fn write_number(&self) -> Result<u64, String> {
        let (write, record) = self.ledger.borrow_mut().next_write();
        if record {
            self.record()
                .await
                .map_err(|e| format!("could not record its write numbers: {e}"))?;
        }
        Ok(write)
    }

    /// What the ledger knows of slave `name`'s store.
    pub(super) fn store(&self, name: &str) -> Option<KnownStore> {
        self.ledger.borrow().store(name)
    }

    /// Notes `known` as slave `name`'s store; whether that changed the
    /// ledger, which must then be recorded ([`Fence::record`]).
    pub(super) fn know(&self, name: &str, known: KnownStore) -> bool {
        self.ledger.borrow_mut().know(name, known)
    }

    /// Records the ledger as it is now, durably, when its turn comes.
    pub(super) async fn record(&self) -> Result<(), StoreError> {
        let _one = self.recording.lock().await;
        let record = self.ledger.borrow().record();
        record.persist().await
    }
}

impl Master {
    /// Stamps a write to the slave process `session`: the master's epoch,
    /// and piece `piece` of write `write`.
    pub(super) fn stamp(&self, mut out: stamp::Builder<'_>, session: u64, write: u64, piece: u64) {
        out.set_session(session);
        out.set_epoch(self.fence.epoch());
        out.set_write(write);
        out.set_piece(piece);
    }

    /// Notes the last write slave `owner` says its store applied.
    pub(super) fn saw_applied(&self, owner: usize, state: capnp::Result<store_state::Reader<'_>>) {
        if let Ok(state) = state {
            self.slaves
                .saw_applied(owner, state.get_store(), state.get_write());
        }
    }

    /// [`Master::saw_applied`] after slave `owner` answered write `write`
    /// as applied: a store that has applied a later write did not apply
    /// this one (its fence took it for an old one), though every write is
    /// sent under the write lock in order and an owner catches up before
    /// anything later reaches it. Its copies would then miss this write
    /// while the write was acknowledged: an error, never an `ok`.
    pub(super) fn saw_write_applied(
        &self,
        owner: usize,
        write: u64,
        state: capnp::Result<store_state::Reader<'_>>,
    ) -> Result<(), String> {
        let ahead = state
            .as_ref()
            .ok()
            .map(|s| s.get_write())
            .filter(|&w| w > write);
        self.saw_applied(owner, state);
        match ahead {
            None => Ok(()),
            Some(applied) => {
                tracing::error!(
                    "slave {} says its store has applied write {applied}, later than write \
                     {write} it was just sent: it did not apply write {write}",
                    self.slave_name(owner)
                );
                Err(format!(
                    "its store has applied write {applied}, later than write {write}, which it \
                     therefore did not apply"
                ))
            }
        }
    }

    /// The outcome of an `import` or a `commit`: `Ok` or why not.
    pub(super) fn read_imported(
        &self,
        outcome: capnp::Result<outcome::Reader<'_>>,
    ) -> Result<(), String> {
        let malformed = |e: capnp::Error| format!("it answered a malformed message: {e}");
        match outcome.and_then(|o| Ok(o.which()?)).map_err(malformed)? {
            outcome::Ok(()) => Ok(()),
            outcome::Error(error) => Err(error
                .and_then(|e| Ok(e.get_message()?.to_string()?))
                .unwrap_or_else(|e| format!("it answered a malformed error: {e}"))),
        }
    }
}
