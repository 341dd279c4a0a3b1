//! The master's journal of writes (docs/protocol.md §8).
//!
//! Every write (an import, a clear or a delete) is recorded here, durably,
//! with its data, before any owner sees it, and stays until every owner
//! has acknowledged it. So a master killed in the middle of a write, or an
//! owner that was down or failed, never leaves owners that differ: the
//! write is rolled forward on every owner still waiting for it, in the
//! order writes were recorded, before that owner is used again (`probe`)
//! or written to (`import`, `update`). A write's id is its number in the
//! master's order ([`Ledger`](super::ledger::Ledger)).
//!
//! Each pending write is one sealed file of the master's data directory,
//! `update-<id>.pending`, holding a `PendingUpdate` message (its changes and
//! the owners still waiting). It is rewritten, whole, as owners
//! acknowledge, and deleted (the deletion synced) when none is left waiting.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bitfold_engine::portable::ARRAY_MAX;
use bitfold_engine::store::{Directory, StoreError, read_sealed, write_sealed};
use bitfold_engine::{SPARSE_MAX, VectorBuf};
use capnp::message::{Builder, HeapAllocator, ReaderOptions};

use crate::bitfold_capnp::{change, pending_update};
use crate::wire;

/// One recorded update, waiting for some owners.
pub(super) struct Pending {
    /// The owners (cluster file index) that have not applied it yet.
    pub(super) waiting: BTreeSet<usize>,
    /// Its `PendingUpdate` message, as recorded.
    message: Builder<HeapAllocator>,
}

impl Pending {
    /// Its changes, in order.
    pub(super) fn changes(&self) -> capnp::Result<capnp::struct_list::Reader<'_, change::Owned>> {
        self.message
            .get_root_as_reader::<pending_update::Reader<'_>>()?
            .get_changes()
    }
}

/// The pending updates, by id (the order they were recorded in).
pub(super) struct Journal {
    dir: Arc<dyn Directory>,
    pending: BTreeMap<u64, Pending>,
}

impl Journal {
    /// Reads every pending update of `dir`; a damaged one is refused with
    /// an error naming its file.
    pub(super) fn open(dir: Arc<dyn Directory>) -> Result<Journal, String> {
        let mut pending = BTreeMap::new();
        for name in dir.list().map_err(|e| e.to_string())? {
            let Some(id) = parse_name(&name) else {
                continue;
            };
            let damaged = |reason: String| {
                format!(
                    "{} is damaged ({reason}); it holds an update not yet applied on every \
                     owner: restore it from a backup, or remove it and check the vectors it \
                     changes on every replica",
                    dir.path(&name).display()
                )
            };
            let body = read_sealed(&*dir, &name).map_err(|e| damaged(e.to_string()))?;
            let message = decode(&body).map_err(|e| damaged(e.to_string()))?;
            let waiting = {
                let root: pending_update::Reader<'_> = message
                    .get_root_as_reader()
                    .map_err(|e| damaged(e.to_string()))?;
                let list = root.get_waiting().map_err(|e| damaged(e.to_string()))?;
                list.iter().map(|i| i as usize).collect()
            };
            pending.insert(id, Pending { waiting, message });
        }
        Ok(Journal { dir, pending })
    }

    /// The id of the last pending write (0 when none is).
    pub(super) fn last_id(&self) -> u64 {
        self.pending.keys().next_back().copied().unwrap_or(0)
    }

    /// The pending updates, in the order they were recorded (for tests and
    /// feature `fuzzing`: what a start read).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) fn pending(&self) -> impl Iterator<Item = (u64, &Pending)> {
        self.pending.iter().map(|(&id, p)| (id, p))
    }

    /// The ids of the updates `owner` has not applied yet, in order.
    pub(super) fn waiting_for(&self, owner: usize) -> Vec<u64> {
        self.pending
            .iter()
            .filter(|(_, p)| p.waiting.contains(&owner))
            .map(|(&id, _)| id)
            .collect()
    }

    /// The pending update `id`.
    pub(super) fn get(&self, id: u64) -> Option<&Pending> {
        self.pending.get(&id)
    }

    /// What the pending writes do to the catalog, taken in the order they
    /// were recorded: the vids they leave existing (imported) and those they
    /// leave deleted, whichever owners have applied them. A master stopped
    /// between recording a write and the catalog's record of it takes these
    /// into its catalog when it starts.
    pub(super) fn catalog_changes(&self) -> Result<(Vec<u64>, Vec<u64>), String> {
        let mut exists = BTreeMap::new();
        for (&id, pending) in &self.pending {
            let changes = pending
                .changes()
                .map_err(|e| format!("recorded write {id} is malformed: {e}"))?;
            for change in changes.iter() {
                match change.which() {
                    Ok(change::Set(_)) => exists.insert(change.get_vid(), true),
                    Ok(change::Delete(())) => exists.insert(change.get_vid(), false),
                    _ => None,
                };
            }
        }
        let (added, deleted): (Vec<_>, Vec<_>) = exists.into_iter().partition(|&(_, e)| e);
        Ok((
            added.into_iter().map(|(vid, _)| vid).collect(),
            deleted.into_iter().map(|(vid, _)| vid).collect(),
        ))
    }

    /// Writes every pending update as this journal would, into `to`, on
    /// this thread (feature `fuzzing`: what a master writes, it must read
    /// back the same).
    #[cfg(feature = "fuzzing")]
    pub(super) fn copy_to(&self, to: &Arc<dyn Directory>) -> Result<(), String> {
        for (&id, pending) in &self.pending {
            let waiting: Vec<usize> = pending.waiting.iter().copied().collect();
            write_waiting(to, id, &pending.message, &waiting)
                .map_err(|e| e.to_string())?
                .apply()
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Adds write `id` (a number greater than every pending one's) made of
    /// the changes of `message` (made with [`init_changes`], kept as it is:
    /// a write's data is not copied), waiting for `owners`; returns what to
    /// make durable with [`Write::persist`] before anything applies it.
    pub(super) fn record(
        &mut self,
        id: u64,
        message: Builder<HeapAllocator>,
        owners: BTreeSet<usize>,
    ) -> capnp::Result<Write> {
        debug_assert!(id > self.last_id(), "write ids grow");
        let waiting: Vec<usize> = owners.iter().copied().collect();
        let write = write_waiting(&self.dir, id, &message, &waiting)?;
        self.pending.insert(
            id,
            Pending {
                waiting: owners,
                message,
            },
        );
        Ok(write)
    }

    /// The write that makes durable that `owners` applied update `id`; call
    /// [`Journal::forget`] once it is. (Memory never runs ahead of the
    /// disk: an owner whose acknowledgement was not recorded applies the
    /// update again, harmlessly, before anything else.)
    pub(super) fn acknowledgement(&self, id: u64, owners: &[usize]) -> capnp::Result<Write> {
        let name = file_name(id);
        let Some(pending) = self.pending.get(&id) else {
            return Ok(Write::Delete(Arc::clone(&self.dir), name));
        };
        let waiting: Vec<usize> = pending
            .waiting
            .iter()
            .copied()
            .filter(|o| !owners.contains(o))
            .collect();
        if waiting.is_empty() {
            return Ok(Write::Delete(Arc::clone(&self.dir), name));
        }
        write_waiting(&self.dir, id, &pending.message, &waiting)
    }

    /// Forgets that `owners` still have to apply update `id`, once that is durable.
    pub(super) fn forget(&mut self, id: u64, owners: &[usize]) {
        if let Some(pending) = self.pending.get_mut(&id) {
            for owner in owners {
                pending.waiting.remove(owner);
            }
            if pending.waiting.is_empty() {
                self.pending.remove(&id);
            }
        }
    }
}

/// The list of `len` changes of a new write's `message`, to fill before
/// [`Journal::record`] takes it.
pub(super) fn init_changes(
    message: &mut Builder<HeapAllocator>,
    len: u32,
) -> capnp::struct_list::Builder<'_, change::Owned> {
    message
        .init_root::<pending_update::Builder<'_>>()
        .init_changes(len)
}

/// A change to the journal's files, made durable off the event loop by
/// [`Write::persist`].
pub(super) enum Write {
    Replace(Arc<dyn Directory>, String, Vec<u8>),
    Delete(Arc<dyn Directory>, String),
}

impl Write {
    /// Writes (and syncs) the change on a blocking thread.
    pub(super) async fn persist(self) -> Result<(), StoreError> {
        let written = tokio::task::spawn_blocking(move || self.apply());
        match written.await {
            Ok(result) => result,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }

    /// Writes (and syncs) the change on this thread.
    pub(super) fn apply(self) -> Result<(), StoreError> {
        match self {
            Write::Replace(dir, name, bytes) => write_sealed(&*dir, &name, &bytes),
            // A deletion lost in a crash would bring an acknowledged write
            // back, to be applied again over later ones.
            // A file already gone (a second acknowledgement of a write no
            // longer pending) is deleted all the same.
            Write::Delete(dir, name) => match dir.delete(&name) {
                Err(StoreError::Io { cause, .. })
                    if cause.kind() == std::io::ErrorKind::NotFound =>
                {
                    dir.sync()
                }
                deleted => deleted.and_then(|()| dir.sync()),
            },
        }
    }
}

/// The write of update `id`'s file in `dir`: the changes of `message`
/// waiting for `waiting`, their vectors in their smallest form (a container
/// of at most 4,096 bits as positions, as roaring keeps it), so that an
/// import's journal costs a fraction of its dense words. [`decode`] gives
/// them back in the form slaves store.
fn write_waiting(
    dir: &Arc<dyn Directory>,
    id: u64,
    message: &Builder<HeapAllocator>,
    waiting: &[usize],
) -> capnp::Result<Write> {
    let changes = message
        .get_root_as_reader::<pending_update::Reader<'_>>()?
        .get_changes()?;
    let mut file = Builder::new_default();
    let mut root: pending_update::Builder<'_> = file.init_root();
    root.set_id(id);
    let mut list = root.reborrow().init_waiting(waiting.len() as u32);
    for (i, &owner) in waiting.iter().enumerate() {
        list.set(i as u32, owner as u32);
    }
    reshape_changes(changes, root.init_changes(changes.len()), ARRAY_MAX)?;
    let bytes = capnp::serialize::write_message_to_words(&file);
    Ok(Write::Replace(Arc::clone(dir), file_name(id), bytes))
}

/// Copies `changes` into `into`, the bits of each clear, replace or set
/// with every container sparse up to `sparse_max` bits and dense above
/// ([`VectorBuf::reshaped`]), cut into parts a slave takes
/// ([`wire::pieces`]).
fn reshape_changes(
    changes: capnp::struct_list::Reader<'_, change::Owned>,
    mut into: capnp::struct_list::Builder<'_, change::Owned>,
    sparse_max: usize,
) -> capnp::Result<()> {
    for (i, change) in changes.iter().enumerate() {
        let mut copy = into.reborrow().get(i as u32);
        copy.set_vid(change.get_vid());
        let (parts, init): (_, fn(change::Builder<'_>, u32) -> PartsBuilder<'_>) =
            match change.which()? {
                change::Delete(()) => {
                    copy.set_delete(());
                    continue;
                }
                change::Clear(parts) => (parts?, |c, n| c.init_clear(n)),
                change::Replace(parts) => (parts?, |c, n| c.init_replace(n)),
                change::Set(parts) => (parts?, |c, n| c.init_set(n)),
            };
        let read = wire::read_parts(parts)?;
        let reshaped: Vec<VectorBuf> = wire::stored_views(&read)?
            .into_iter()
            .map(|part| VectorBuf::reshaped(part, sparse_max))
            .collect();
        let pieces: Vec<_> = reshaped
            .iter()
            .flat_map(|buf| wire::pieces(&buf.as_part()))
            .collect();
        wire::at_most(pieces.len() as u32, wire::MAX_PARTS, "parts of a vector")?;
        wire::write_parts(init(copy, pieces.len() as u32), &pieces);
    }
    Ok(())
}

type PartsBuilder<'a> = capnp::struct_list::Builder<'a, crate::bitfold_capnp::part::Owned>;

fn file_name(id: u64) -> String {
    format!("update-{id:020}.pending")
}

fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("update-")?.strip_suffix(".pending")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Decodes a recorded message into a builder, each change's vectors in the
/// form slaves store (a container sparse up to [`SPARSE_MAX`] bits).
/// Refused: more changes than the file has words (each takes three as the
/// master writes it; a list of empty structs takes none, and would cost the
/// roll-forward memory in proportion to its count), or a clear, replace or
/// set of more parts than a vector travels as, or a malformed one (an
/// update no owner could apply).
fn decode(body: &[u8]) -> capnp::Result<Builder<HeapAllocator>> {
    let mut options = ReaderOptions::new();
    options.traversal_limit_in_words(Some(crate::net::MAX_MESSAGE_WORDS));
    let reader = capnp::serialize::read_message_from_flat_slice(&mut &body[..], options)?;
    let root: pending_update::Reader<'_> = reader.get_root()?;
    let changes = root.get_changes()?;
    super::start::within_file(changes.len(), body.len(), "changes")?;
    let mut message = Builder::new_default();
    let mut copy: pending_update::Builder<'_> = message.init_root();
    copy.set_id(root.get_id());
    copy.set_waiting(root.get_waiting()?)?;
    reshape_changes(changes, copy.init_changes(changes.len()), SPARSE_MAX)?;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_engine::store::MemoryDirectory;

    fn deletes(vids: &[u64]) -> Builder<HeapAllocator> {
        let mut message = Builder::new_default();
        let mut list = init_changes(&mut message, vids.len() as u32);
        for (i, &vid) in vids.iter().enumerate() {
            let mut change = list.reborrow().get(i as u32);
            change.set_vid(vid);
            change.set_delete(());
        }
        message
    }

    fn vids(pending: &Pending) -> Vec<u64> {
        pending
            .changes()
            .unwrap()
            .iter()
            .map(|c| c.get_vid())
            .collect()
    }

    #[test]
    fn pending_updates_survive_a_restart_until_every_owner_acknowledges() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let dir: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        let mut journal = Journal::open(dir.clone()).unwrap();
        for (id, changes, owners) in [(1, deletes(&[3, 9]), [0, 1]), (2, deletes(&[4]), [1, 2])] {
            let write = journal
                .record(id, changes, owners.into_iter().collect())
                .unwrap();
            runtime.block_on(write.persist()).unwrap();
        }
        let write = journal.acknowledgement(1, &[0]).unwrap();
        assert_eq!(
            journal.waiting_for(0),
            vec![1],
            "not forgotten before it is durable"
        );
        runtime.block_on(write.persist()).unwrap();
        journal.forget(1, &[0]);
        let journal = Journal::open(dir.clone()).unwrap();
        assert_eq!(journal.waiting_for(0), Vec::<u64>::new());
        assert_eq!(journal.waiting_for(1), vec![1, 2]);
        assert_eq!(journal.waiting_for(2), vec![2]);
        assert_eq!(vids(journal.get(1).unwrap()), vec![3, 9]);
        let mut journal = journal;
        let write = journal.acknowledgement(1, &[1]).unwrap();
        runtime.block_on(write.persist()).unwrap();
        journal.forget(1, &[1]);
        assert!(journal.get(1).is_none());
        let journal = Journal::open(dir.clone()).unwrap();
        assert_eq!(journal.pending().map(|(id, _)| id).collect::<Vec<_>>(), [2]);
        assert_eq!(journal.last_id(), 2);
    }

    #[test]
    fn an_import_is_journaled_small_and_read_back_as_slaves_store_it() {
        // Vector 7: a dense container of 600 bits (key 0), one of 5,000
        // bits (key 1), and a sparse one of 3 bits (key 2), as an import
        // sends them.
        let mut vector = VectorBuf::new();
        let mut words = [0u64; bitfold_engine::CONTAINER_WORDS];
        (0..600).for_each(|b| words[b * 100 / 64] |= 1 << (b * 100 % 64));
        vector.push_dense(0, &words).unwrap();
        let mut words = [0u64; bitfold_engine::CONTAINER_WORDS];
        (0..5_000).for_each(|b| words[b * 13 / 64] |= 1 << (b * 13 % 64));
        vector.push_dense(1, &words).unwrap();
        vector.push_sparse(2, &[1, 2, 3]).unwrap();
        let mut message = Builder::new_default();
        let mut change = init_changes(&mut message, 1).get(0);
        change.set_vid(7);
        wire::write_parts(change.init_set(1), &[vector.as_part()]);

        let dir: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        let mut journal = Journal::open(dir.clone()).unwrap();
        let write = journal.record(1, message, BTreeSet::from([0])).unwrap();
        write.apply().unwrap();
        // 600 positions instead of 1,024 words; the fuller container dense.
        let size = dir.read(&file_name(1)).unwrap().len();
        assert!((9_500..10_500).contains(&size), "{size} bytes");

        let journal = Journal::open(dir).unwrap();
        let changes = journal.get(1).unwrap().changes().unwrap();
        let change::Set(parts) = changes.get(0).which().unwrap() else {
            panic!("the import came back as another change");
        };
        let read = wire::read_parts(parts.unwrap()).unwrap();
        let views = wire::stored_views(&read).unwrap();
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].dense_keys(), &[0, 1]);
        assert_eq!(views[0].sparse_keys(), &[2]);
        assert!(views[0].bits().eq(vector.as_part().bits()));
    }

    #[test]
    fn an_entry_of_more_changes_than_its_words_is_refused() {
        // A PendingUpdate whose changes are 2^27 - 16 empty structs: five
        // words, which a copy for an owner would make gigabytes.
        let count: u64 = (1 << 27) - 16;
        let mut body = Vec::new();
        for word in [
            5 << 32,           // segment table: one segment of 5 words
            1 << 32 | 2 << 48, // root: 1 data word, 2 pointers
            0,                 // id
            0,                 // waiting: none
            1 | 7 << 32,       // changes: a list of structs, its tag next
            count << 2,        // the tag: `count` structs of no words
        ] {
            body.extend(u64::to_le_bytes(word));
        }
        let dir: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        write_sealed(&*dir, &file_name(3), &body).unwrap();
        let refused = Journal::open(dir).err().unwrap();
        assert!(
            refused.contains(&format!("{count} changes in a file of 48 bytes")),
            "{refused}"
        );
        assert!(
            refused.contains("update-00000000000000000003.pending"),
            "{refused}"
        );
    }

    #[test]
    fn a_damaged_journal_entry_is_refused_by_name() {
        let dir: Arc<dyn Directory> = Arc::new(MemoryDirectory::new());
        let mut file = dir.create(&file_name(5)).unwrap();
        file.write_all(b"not a sealed file at all, just some bytes here")
            .unwrap();
        file.commit().unwrap();
        let refused = Journal::open(dir).err().unwrap();
        assert!(
            refused.contains("update-00000000000000000005.pending"),
            "{refused}"
        );
        assert!(refused.contains("restore it"), "{refused}");
    }
}
