//! The state machine: the master's records directory, one file per
//! record, changed by the log's entries in order ([`Change`]), and its
//! snapshots (every file, whole).
//!
//! What has been applied is recorded in the Raft folder's `applied` file
//! after the files it covers are durable; a change applied again after a
//! crash leaves the same files, so a master stopped at any instant applies
//! from its record on. A snapshot received is kept in the Raft folder's
//! `snapshot` file before the records directory is replaced by it, so a
//! master stopped in the middle replaces it again when it starts.

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bitfold_engine::store::{AppendFile, Directory, StoreError, write_sealed};
use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use crate::{Change, Member, REMOVE_THE_DATA, Records, read_kept};

const APPLIED: &str = "applied";
const SNAPSHOT: &str = "snapshot";

type Meta = SnapshotMeta<u64, Member>;

/// The records directory as Raft's state machine; clones share it.
#[derive(Clone)]
pub struct FileMachine {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    /// The records directory.
    records: Arc<dyn Directory>,
    /// The Raft folder, for `applied` and `snapshot`.
    raft: Arc<dyn Directory>,
    applied: Applied,
    /// The append-only files open for writing.
    appending: HashMap<String, Box<dyn AppendFile>>,
    /// The latest snapshot built or installed: its meta and body.
    snapshot: Option<(Meta, Arc<Vec<u8>>)>,
    /// Snapshots built by this process, for their ids.
    built: u64,
}

/// How far the directory is: the last entry applied and the membership.
#[derive(Clone, Default, Serialize, Deserialize)]
struct Applied {
    last: Option<LogId<u64>>,
    membership: StoredMembership<u64, Member>,
}

/// A snapshot's body: every file of the records directory.
#[derive(Serialize, Deserialize)]
struct Files {
    files: Vec<(String, Vec<u8>)>,
}

/// A snapshot as kept in the Raft folder.
#[derive(Deserialize)]
struct Kept {
    meta: Meta,
    body: Vec<u8>,
}

/// A snapshot to keep in the Raft folder (encoded as [`Kept`] reads it).
#[derive(Serialize)]
struct Keep<'a> {
    meta: &'a Meta,
    body: &'a [u8],
}

/// Keeps snapshot `meta` with `body` in `raft`, durably.
fn keep(raft: &dyn Directory, meta: &Meta, body: &[u8]) -> Result<(), AnyError> {
    let kept = postcard::to_stdvec(&Keep { meta, body }).map_err(io_error)?;
    write_sealed(raft, SNAPSHOT, &kept).map_err(io_error)
}

fn io_error(e: impl ToString) -> AnyError {
    AnyError::error(e.to_string())
}

/// The names of the files a snapshot holds: the records', not the lock
/// or a file being written.
fn record_names(dir: &dyn Directory) -> Result<Vec<String>, StoreError> {
    let mut names: Vec<String> = dir
        .list()?
        .into_iter()
        .filter(|n| n != "LOCK" && !n.ends_with(".tmp"))
        .collect();
    names.sort();
    Ok(names)
}

impl FileMachine {
    /// Opens the state machine of `records`, with its record of what it
    /// applied in `raft`; finishes installing a snapshot a stop
    /// interrupted.
    pub fn open(
        records: Arc<dyn Directory>,
        raft: Arc<dyn Directory>,
    ) -> Result<FileMachine, String> {
        let applied: Applied = read_kept(&*raft, APPLIED, REMOVE_THE_DATA)?.unwrap_or_default();
        let kept: Option<Kept> = read_kept(&*raft, SNAPSHOT, REMOVE_THE_DATA)?;
        let machine = FileMachine {
            inner: Arc::new(Mutex::new(Inner {
                records,
                raft,
                applied,
                appending: HashMap::new(),
                snapshot: None,
                built: 0,
            })),
        };
        if let Some(Kept { meta, body }) = kept {
            let mut inner = machine.lock();
            if meta.last_log_id > inner.applied.last {
                inner.restore(&meta, &body).map_err(|e| e.to_string())?;
            }
            inner.snapshot = Some((meta, Arc::new(body)));
        }
        Ok(machine)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The index of the last entry applied (0 before any).
    pub fn applied(&self) -> u64 {
        self.lock().applied.last.map_or(0, |id| id.index)
    }
}

impl Inner {
    fn apply(&mut self, change: &Change) -> Result<(), StoreError> {
        match change {
            Change::Write { name, bytes } => {
                self.appending.remove(name);
                let mut file = self.records.create(name)?;
                file.write_all(bytes)?;
                file.commit()
            }
            Change::Delete { name } => {
                self.appending.remove(name);
                match self.records.delete(name) {
                    Err(e) if !e.is_not_found() => Err(e),
                    _ => Ok(()),
                }
            }
            Change::WriteAt { name, at, bytes } => self.appending(name)?.write_at(*at, bytes),
            Change::Truncate { name, len } => self.appending(name)?.truncate(*len),
            Change::Rename { from, to } => {
                self.appending.remove(from);
                self.appending.remove(to);
                match self.records.read(from) {
                    Ok(bytes) => {
                        let mut file = self.records.create(to)?;
                        file.write_all(&bytes)?;
                        file.commit()?;
                        self.records.delete(from)
                    }
                    // Applied before a crash, and again now: `to` is whole.
                    Err(e) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e),
                }
            }
        }
    }

    fn appending(&mut self, name: &str) -> Result<&mut Box<dyn AppendFile>, StoreError> {
        if !self.appending.contains_key(name) {
            let file = self.records.open_append(name)?;
            self.appending.insert(name.to_owned(), file);
        }
        Ok(self.appending.get_mut(name).expect("inserted above"))
    }

    /// Records `applied` once what it covers is durable.
    fn record_applied(&mut self) -> Result<(), AnyError> {
        self.records.sync().map_err(io_error)?;
        let body = postcard::to_stdvec(&self.applied).map_err(io_error)?;
        write_sealed(&*self.raft, APPLIED, &body).map_err(io_error)
    }

    /// Replaces every record by the files of snapshot `body`.
    fn restore(&mut self, meta: &Meta, body: &[u8]) -> Result<(), AnyError> {
        let Files { files } = postcard::from_bytes(body).map_err(io_error)?;
        self.appending.clear();
        for name in record_names(&*self.records).map_err(io_error)? {
            if !files.iter().any(|(n, _)| *n == name) {
                self.records.delete(&name).map_err(io_error)?;
            }
        }
        for (name, bytes) in files {
            let mut file = self.records.create(&name).map_err(io_error)?;
            file.write_all(&bytes).map_err(io_error)?;
            file.commit().map_err(io_error)?;
        }
        self.applied = Applied {
            last: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        self.record_applied()
    }
}

impl RaftSnapshotBuilder<Records> for FileMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<Records>, StorageError<u64>> {
        let mut inner = self.lock();
        let fail = |e: AnyError| StorageIOError::write_snapshot(None, e);
        let mut files = Vec::new();
        for name in record_names(&*inner.records).map_err(|e| fail(io_error(e)))? {
            let bytes = inner.records.read(&name).map_err(|e| fail(io_error(e)))?;
            files.push((name, bytes.to_vec()));
        }
        let body = postcard::to_stdvec(&Files { files }).map_err(|e| fail(io_error(e)))?;
        inner.built += 1;
        let meta = Meta {
            last_log_id: inner.applied.last,
            last_membership: inner.applied.membership.clone(),
            snapshot_id: format!(
                "{}-{}",
                inner.applied.last.map_or(0, |id| id.index),
                inner.built
            ),
        };
        keep(&*inner.raft, &meta, &body).map_err(fail)?;
        inner.snapshot = Some((meta.clone(), Arc::new(body.clone())));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(body)),
        })
    }
}

impl RaftStateMachine<Records> for FileMachine {
    type SnapshotBuilder = FileMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, Member>), StorageError<u64>> {
        let inner = self.lock();
        Ok((inner.applied.last, inner.applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<Records>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let mut results = Vec::new();
        for entry in entries {
            match &entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(change) => inner
                    .apply(change)
                    .map_err(|e| StorageIOError::apply(entry.log_id, io_error(e)))?,
                EntryPayload::Membership(membership) => {
                    inner.applied.membership =
                        StoredMembership::new(Some(entry.log_id), membership.clone());
                }
            }
            inner.applied.last = Some(entry.log_id);
            results.push(());
        }
        inner
            .record_applied()
            .map_err(StorageIOError::write_state_machine)?;
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> FileMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let body = snapshot.into_inner();
        let mut inner = self.lock();
        let fail = |e: AnyError| StorageIOError::write_snapshot(Some(meta.signature()), e);
        keep(&*inner.raft, meta, &body).map_err(fail)?;
        inner.restore(meta, &body).map_err(fail)?;
        inner.snapshot = Some((meta.clone(), Arc::new(body)));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<Records>>, StorageError<u64>> {
        let inner = self.lock();
        Ok(inner.snapshot.as_ref().map(|(meta, body)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(body.to_vec())),
        }))
    }
}
