//! The master's ledger (docs/protocol.md §8): its epoch, the write numbers
//! it gives out, and the store it checked on each slave.
//!
//! - **Epoch**: one more at every start of the master. Every write carries
//!   it, and a slave refuses a write of an older epoch than one it applied,
//!   so a master that was replaced can no longer write.
//! - **Write numbers**: every write (an import, a clear, a delete, a copy)
//!   gets a number greater than every number given before, across
//!   restarts, which a slave's fence orders writes by. Numbers are
//!   reserved in blocks: the ledger records the end of the block, so a
//!   restart skips the rest of it and never gives a number twice.
//! - **Stores**: per slave (by name), the id of the store that holds every
//!   vector it owns, and a write that store is known to have applied (a
//!   lower bound, recorded from time to time). A slave whose store has
//!   another id (a wiped disk, a new machine) or has applied less (a
//!   restored backup) serves nothing until it is refilled.
//!
//! It is one sealed file of the master's data directory, `ledger`,
//! rewritten whole from what the master holds ([`Ledger::record`]); the
//! master writes it one record at a time.

use std::collections::BTreeMap;
use std::sync::Arc;

use bitfold_engine::store::{Directory, read_sealed};
use capnp::message::{Builder, ReaderOptions};

use super::journal::Write;
use super::recorded;
use crate::bitfold_capnp::ledger;

/// The file, in the master's data directory.
const FILE: &str = "ledger";

/// How many write numbers one record of the ledger reserves.
const RESERVED: u64 = 1 << 16;

/// What the master knows of one slave's store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KnownStore {
    /// The store's id.
    pub(super) store: u64,
    /// A write it is known to have applied.
    pub(super) applied: u64,
}

/// The ledger, as the master holds it.
#[derive(Debug)]
pub(super) struct Ledger {
    dir: Arc<dyn Directory>,
    epoch: u64,
    next_write: u64,
    /// No number at or past it is given before the ledger says so.
    reserved: u64,
    stores: BTreeMap<String, KnownStore>,
}

impl Ledger {
    /// Reads the ledger of `dir` (none: a new master's) and starts a new
    /// epoch, durably, after every write number `used` (the journal's).
    pub(super) fn start(dir: Arc<dyn Directory>, used: u64) -> Result<Ledger, String> {
        let mut ledger = read(dir)?;
        ledger.epoch += 1;
        ledger.next_write = ledger.next_write.max(used.saturating_add(1)).max(1);
        ledger.reserved = ledger.next_write.saturating_add(RESERVED);
        ledger.record().apply().map_err(|e| {
            format!(
                "the master could not record its new epoch in {}: {e}",
                ledger.dir.path(FILE).display()
            )
        })?;
        Ok(ledger)
    }

    /// This master's epoch.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A new write number, and whether the ledger must be recorded before
    /// it is used (the reserved block was used up: the next is reserved).
    pub(super) fn next_write(&mut self) -> (u64, bool) {
        let write = self.next_write;
        self.next_write += 1;
        let record = write >= self.reserved;
        if record {
            self.reserved = self.next_write.saturating_add(RESERVED);
        }
        (write, record)
    }

    /// What the ledger knows of slave `name`'s store.
    pub(super) fn store(&self, name: &str) -> Option<KnownStore> {
        self.stores.get(name).copied()
    }

    /// Notes `known` as slave `name`'s store; whether that changed the
    /// ledger (which must then be recorded).
    pub(super) fn know(&mut self, name: &str, known: KnownStore) -> bool {
        if self.stores.get(name) == Some(&known) {
            return false;
        }
        self.stores.insert(name.to_owned(), known);
        true
    }

    /// The whole ledger, as it is now, as a write.
    pub(super) fn record(&self) -> Write {
        self.record_in(Arc::clone(&self.dir))
    }

    /// Every store it names: the slave's name, the store id and a write it
    /// applied (feature `fuzzing`: what a start read).
    #[cfg(feature = "fuzzing")]
    pub(super) fn stores(&self) -> Vec<(String, u64, u64)> {
        self.stores
            .iter()
            .map(|(name, known)| (name.clone(), known.store, known.applied))
            .collect()
    }

    /// The whole ledger as a write into `dir`.
    pub(super) fn record_in(&self, dir: Arc<dyn Directory>) -> Write {
        let mut message = Builder::new_default();
        let mut root: ledger::Builder<'_> = message.init_root();
        root.set_epoch(self.epoch);
        root.set_next_write(self.reserved);
        let mut list = root.init_slaves(self.stores.len() as u32);
        for (i, (name, known)) in self.stores.iter().enumerate() {
            let mut slave = list.reborrow().get(i as u32);
            slave.set_name(name);
            slave.set_store(known.store);
            slave.set_applied(known.applied);
        }
        let bytes = capnp::serialize::write_message_to_words(&message);
        Write::Replace(dir, FILE.to_string(), bytes)
    }
}

/// The ledger `dir` holds, as recorded (epoch and numbers not advanced).
fn read(dir: Arc<dyn Directory>) -> Result<Ledger, String> {
    let mut ledger = Ledger {
        dir,
        epoch: 0,
        next_write: 1,
        reserved: 1,
        stores: BTreeMap::new(),
    };
    if !recorded::holds(&*ledger.dir, FILE)? {
        return Ok(ledger);
    }
    let damaged = |reason: String| {
        format!(
            "{} is damaged ({reason}); it holds the master's epoch, its write numbers and the \
             store each slave holds: restore it from a backup (without it the master cannot \
             tell a wiped slave from a good one)",
            ledger.dir.path(FILE).display()
        )
    };
    let body = read_sealed(&*ledger.dir, FILE).map_err(|e| damaged(e.to_string()))?;
    let mut options = ReaderOptions::new();
    options.traversal_limit_in_words(Some(crate::net::MAX_MESSAGE_WORDS));
    let message = capnp::serialize::read_message_from_flat_slice(&mut &body[..], options)
        .map_err(|e| damaged(e.to_string()))?;
    let mut fill = || -> capnp::Result<()> {
        let root = message.get_root::<ledger::Reader<'_>>()?;
        ledger.epoch = root.get_epoch();
        ledger.next_write = root.get_next_write().max(1);
        let list = root.get_slaves()?;
        super::start::within_file(list.len(), body.len(), "slaves")?;
        for slave in list.iter() {
            let known = KnownStore {
                store: slave.get_store(),
                applied: slave.get_applied(),
            };
            ledger
                .stores
                .insert(slave.get_name()?.to_str()?.to_owned(), known);
        }
        Ok(())
    };
    fill().map_err(|e| damaged(e.to_string()))?;
    Ok(ledger)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_engine::store::MemoryDirectory;

    #[test]
    fn epochs_and_write_numbers_grow_across_restarts() {
        let dir: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        let mut first = Ledger::start(dir.clone(), 0).unwrap();
        assert_eq!(first.epoch(), 1);
        let (a, record) = first.next_write();
        assert!(!record, "the start reserved a block");
        let (b, _) = first.next_write();
        assert!(b > a);
        let known = KnownStore {
            store: 9,
            applied: b,
        };
        assert!(first.know("s1", known));
        first.record().apply().unwrap();
        assert!(!first.know("s1", known), "nothing new to record");
        // A restart skips what the first master reserved, and after the
        // journal's numbers.
        let mut second = Ledger::start(dir.clone(), 5).unwrap();
        assert_eq!(second.epoch(), 2);
        let (c, _) = second.next_write();
        assert!(c > b && c > 5, "{c}");
        assert_eq!(second.store("s1"), Some(known));
        assert_eq!(second.store("s2"), None);
        let third = Ledger::start(dir.clone(), u64::MAX - 1).unwrap();
        assert_eq!(third.epoch(), 3);
    }

    #[test]
    fn a_used_up_block_is_recorded_before_its_numbers_are_given() {
        let dir: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        let mut ledger = Ledger::start(dir.clone(), 0).unwrap();
        let mut last = 0;
        for _ in 0..=RESERVED {
            let (write, record) = ledger.next_write();
            if record {
                ledger.record().apply().unwrap();
            }
            last = write;
        }
        let again = Ledger::start(dir, 0).unwrap();
        assert!(again.next_write > last);
    }

    #[test]
    fn a_damaged_ledger_is_refused_naming_its_file() {
        let dir: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        bitfold_engine::store::write_sealed(&*dir, FILE, b"not a message").unwrap();
        let err = Ledger::start(dir, 0).unwrap_err();
        assert!(err.contains("ledger is damaged"), "{err}");
    }
}
