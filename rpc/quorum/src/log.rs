//! The Raft log and vote of one master, in its Raft folder: each entry a
//! sealed file `entry-<index>`, the vote and the last purged entry's id
//! sealed files `vote` and `purged`. Every file is written whole and
//! renamed into place, so a crash leaves each one old or new. Entries are
//! read from disk when asked for; memory holds only their ids, and the
//! entries not yet written.
//!
//! Entries are written, cut and purged by a thread of their own, in the
//! order Raft asks, and Raft is told when appended entries are durable:
//! writing a large entry never holds up the heartbeats and elections Raft
//! runs meanwhile.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};

use bitfold_engine::store::{Directory, write_sealed};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};
use serde::Serialize;

use tokio::sync::oneshot;

use crate::{REMOVE_THE_DATA, Records, read_kept};

const VOTE: &str = "vote";
const PURGED: &str = "purged";
const ENTRY: &str = "entry-";

/// The log: shared by the Raft core and its readers.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    /// The queue of the thread that writes the log.
    writer: mpsc::Sender<Work>,
}

struct Inner {
    dir: Arc<dyn Directory>,
    /// The id of every entry held, by index.
    ids: BTreeMap<u64, LogId<u64>>,
    /// The entries appended but not yet written, by index.
    unwritten: BTreeMap<u64, Entry<Records>>,
    vote: Option<Vote<u64>>,
    purged: Option<LogId<u64>>,
}

/// What the writing thread does, in the order asked.
enum Work {
    /// Writes these entries, then tells Raft.
    Append(Vec<Entry<Records>>, LogFlushed<Records>),
    /// Records the last purged entry (if any), then deletes these entries,
    /// in this order, durably.
    Remove {
        purged: Option<LogId<u64>>,
        indexes: Vec<u64>,
        done: oneshot::Sender<Result<(), String>>,
    },
}

impl LogStore {
    /// Reads the log of `dir` (the master's Raft folder); a damaged file or
    /// a gap between entries is refused with an error naming it.
    pub fn open(dir: Arc<dyn Directory>) -> Result<LogStore, String> {
        let vote = read_kept(&*dir, VOTE, REMOVE_THE_DATA)?;
        let purged: Option<LogId<u64>> = read_kept(&*dir, PURGED, REMOVE_THE_DATA)?;
        let mut ids = BTreeMap::new();
        for name in dir.list().map_err(|e| e.to_string())? {
            let Some(index) = name.strip_prefix(ENTRY).and_then(|i| i.parse::<u64>().ok()) else {
                continue;
            };
            let entry = read_entry(&*dir, &name)?;
            if entry.log_id.index != index {
                return Err(format!(
                    "{} holds entry {} of the Raft log, not {index}: {REMOVE_THE_DATA}",
                    dir.path(&name).display(),
                    entry.log_id.index
                ));
            }
            ids.insert(index, entry.log_id);
        }
        let first = purged.map_or(0, |p| p.index + 1);
        ids.retain(|&i, _| i >= first);
        let contiguous = ids.keys().zip(ids.keys().skip(1)).all(|(a, b)| *b == a + 1);
        let starts = purged.is_none() || ids.keys().next().is_none_or(|&i| i == first);
        if !contiguous || !starts {
            return Err(format!(
                "the Raft log in {} has a gap: {REMOVE_THE_DATA}",
                dir.path("").display()
            ));
        }
        let inner = Arc::new(Mutex::new(Inner {
            dir,
            ids,
            unwritten: BTreeMap::new(),
            vote,
            purged,
        }));
        let (writer, work) = mpsc::channel();
        let writing = inner.clone();
        std::thread::Builder::new()
            .name("raft-log".into())
            .spawn(move || write_all(&writing, &work))
            .map_err(|e| format!("cannot start the thread that writes the Raft log: {e}"))?;
        Ok(LogStore { inner, writer })
    }

    /// Hands `work` to the writing thread.
    #[allow(
        clippy::result_large_err,
        reason = "openraft's error type, as its traits return it"
    )]
    fn queue(&self, work: Work) -> Result<(), StorageError<u64>> {
        if self.writer.send(work).is_err() {
            return Err(StorageIOError::write_logs(AnyError::error(
                "the Raft log's writer stopped",
            ))
            .into());
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last entry held (or purged), if any.
    pub(crate) fn last_index(&self) -> Option<u64> {
        let inner = self.lock();
        inner
            .ids
            .keys()
            .next_back()
            .copied()
            .or(inner.purged.map(|p| p.index))
    }

    /// Whether this log was never written: a master starting a new cluster.
    pub fn is_new(&self) -> bool {
        let inner = self.lock();
        inner.vote.is_none() && inner.ids.is_empty() && inner.purged.is_none()
    }
}

fn entry_name(index: u64) -> String {
    format!("{ENTRY}{index:020}")
}

fn encode(value: &impl Serialize) -> Result<Vec<u8>, AnyError> {
    postcard::to_stdvec(value).map_err(|e| AnyError::error(e.to_string()))
}

/// Entry file `name` of `dir`, which its listing holds.
fn read_entry(dir: &dyn Directory, name: &str) -> Result<Entry<Records>, String> {
    read_kept(dir, name, REMOVE_THE_DATA)?.ok_or_else(|| {
        format!(
            "{} is gone from the Raft log: {REMOVE_THE_DATA}",
            dir.path(name).display()
        )
    })
}

fn write(dir: &dyn Directory, name: &str, value: &impl Serialize) -> Result<(), AnyError> {
    let body = encode(value)?;
    write_sealed(dir, name, &body).map_err(|e| AnyError::error(e.to_string()))
}

impl RaftLogReader<Records> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<Records>>, StorageError<u64>> {
        let inner = self.lock();
        let mut entries = Vec::new();
        for &index in inner.ids.range(range).map(|(i, _)| i) {
            let entry = match inner.unwritten.get(&index) {
                Some(entry) => entry.clone(),
                None => read_entry(&*inner.dir, &entry_name(index))
                    .map_err(|e| StorageIOError::read_log_at_index(index, AnyError::error(e)))?,
            };
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<Records> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<Records>, StorageError<u64>> {
        let inner = self.lock();
        let last = inner.ids.values().next_back().copied().or(inner.purged);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let mut inner = self.lock();
        write(&*inner.dir, VOTE, vote).map_err(StorageIOError::write_vote)?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<Records>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<Records>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<Records>> = entries.into_iter().collect();
        {
            let mut inner = self.lock();
            for entry in &entries {
                inner.ids.insert(entry.log_id.index, entry.log_id);
                inner.unwritten.insert(entry.log_id.index, entry.clone());
            }
        }
        self.queue(Work::Append(entries, callback))
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let cut: Vec<u64> = {
            let mut inner = self.lock();
            let cut: Vec<u64> = inner.ids.range(log_id.index..).map(|(&i, _)| i).collect();
            for index in &cut {
                inner.ids.remove(index);
                inner.unwritten.remove(index);
            }
            cut
        };
        // Last first: a crash leaves the log without a gap.
        self.remove(None, cut.into_iter().rev().collect()).await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let gone: Vec<u64> = {
            let mut inner = self.lock();
            inner.purged = Some(log_id);
            let gone: Vec<u64> = inner.ids.range(..=log_id.index).map(|(&i, _)| i).collect();
            for index in &gone {
                inner.ids.remove(index);
                inner.unwritten.remove(index);
            }
            gone
        };
        // First first: a crash leaves the log without a gap.
        self.remove(Some(log_id), gone).await
    }
}

impl LogStore {
    /// Has the writing thread remove `indexes` (after recording `purged`)
    /// once what it was asked before is done, and waits for it.
    async fn remove(
        &self,
        purged: Option<LogId<u64>>,
        indexes: Vec<u64>,
    ) -> Result<(), StorageError<u64>> {
        let (done, removed) = oneshot::channel();
        self.queue(Work::Remove {
            purged,
            indexes,
            done,
        })?;
        let outcome = removed
            .await
            .unwrap_or_else(|_| Err("the Raft log's writer stopped".into()));
        outcome.map_err(|e| StorageIOError::write_logs(AnyError::error(e)).into())
    }
}

/// The writing thread: does `work` in order until every [`LogStore`] is gone.
fn write_all(inner: &Mutex<Inner>, work: &mpsc::Receiver<Work>) {
    let dir = inner
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .dir
        .clone();
    while let Ok(next) = work.recv() {
        match next {
            Work::Append(entries, callback) => {
                let mut written = Ok(());
                for entry in &entries {
                    written = write(&*dir, &entry_name(entry.log_id.index), entry);
                    if written.is_err() {
                        break;
                    }
                    let mut inner = inner.lock().unwrap_or_else(PoisonError::into_inner);
                    // Unless cut and appended again meanwhile, it is on disk now.
                    if inner.unwritten.get(&entry.log_id.index).map(|e| e.log_id)
                        == Some(entry.log_id)
                    {
                        inner.unwritten.remove(&entry.log_id.index);
                    }
                }
                callback.log_io_completed(written.map_err(io::Error::other));
            }
            Work::Remove {
                purged,
                indexes,
                done,
            } => {
                let removed = (|| -> Result<(), String> {
                    if let Some(purged) = purged {
                        write(&*dir, PURGED, &purged).map_err(|e| e.to_string())?;
                    }
                    for index in indexes {
                        match dir.delete(&entry_name(index)) {
                            Err(e) if !e.is_not_found() => return Err(e.to_string()),
                            _ => {}
                        }
                    }
                    dir.sync().map_err(|e| e.to_string())
                })();
                let _ = done.send(removed);
            }
        }
    }
}
