//! The records directory as the leading master writes it: reads from this
//! master's copy; each write proposed to Raft, returning once a majority of
//! masters holds it and this master has applied it.

use std::io;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use bitfold_engine::store::{AppendFile, Directory, FileBytes, FileWriter, StoreError};
use openraft::Raft;
use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::Notify;

use crate::network::CHANGE_BYTES;
use crate::{Change, Records};

/// The records directory, replicated (see the module).
pub struct ReplicatedDirectory {
    local: Arc<dyn Directory>,
    raft: Raft<Records>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    failed: Arc<Notify>,
}

impl std::fmt::Debug for ReplicatedDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatedDirectory")
            .field("local", &self.local)
            .finish()
    }
}

impl ReplicatedDirectory {
    pub(crate) fn new(
        local: Arc<dyn Directory>,
        raft: Raft<Records>,
        runtime: tokio::runtime::Handle,
        timeout: Duration,
        failed: Arc<Notify>,
    ) -> ReplicatedDirectory {
        ReplicatedDirectory {
            local,
            raft,
            runtime,
            timeout,
            failed,
        }
    }

    /// Proposes `change` and waits, blocking this thread, until it is
    /// applied here or has failed; Raft runs on threads of its own.
    fn propose(&self, name: &str, change: Change) -> Result<(), StoreError> {
        let size = match &change {
            Change::Write { bytes, .. } | Change::WriteAt { bytes, .. } => bytes.len(),
            Change::Delete { .. } | Change::Truncate { .. } | Change::Rename { .. } => 0,
        };
        if size > CHANGE_BYTES {
            // Refused before Raft sees it: an entry no message can carry
            // would stop the log for good.
            return Err(StoreError::Io {
                action: "replicate",
                path: self.local.path(name),
                cause: io::Error::other(format!(
                    "a record of {size} bytes is larger than the masters replicate ({} MiB): \
                     write in smaller batches",
                    CHANGE_BYTES >> 20
                )),
            });
        }
        let (done, outcome) = mpsc::sync_channel(1);
        let raft = self.raft.clone();
        self.runtime.spawn(async move {
            let written = raft.client_write(change).await;
            let _ = done.send(written.map(|_| ()).map_err(|e| {
                match e {
                    RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
                        "this master lost the lead while recording it (another is being elected): \
                     retry on the leader"
                            .to_owned()
                    }
                    e => e.to_string(),
                }
            }));
        });
        let why = match outcome.recv_timeout(self.timeout) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => format!("the masters did not record it: {e}"),
            Err(_) => format!(
                "no majority of masters recorded it within {:?}: are most masters down?",
                self.timeout
            ),
        };
        // What this master holds in memory may now differ from the
        // records: it must start again from them.
        self.failed.notify_one();
        Err(StoreError::Io {
            action: "replicate",
            path: self.local.path(name),
            cause: io::Error::other(why),
        })
    }
}

impl Directory for ReplicatedDirectory {
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.local.path(name)
    }

    fn list(&self) -> Result<Vec<String>, StoreError> {
        self.local.list()
    }

    fn read(&self, name: &str) -> Result<FileBytes, StoreError> {
        self.local.read(name)
    }

    fn create(&self, name: &str) -> Result<Box<dyn FileWriter>, StoreError> {
        Ok(Box::new(Staged {
            dir: self.clone_handle(),
            name: name.to_owned(),
            bytes: Vec::new(),
        }))
    }

    fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.propose(
            name,
            Change::Delete {
                name: name.to_owned(),
            },
        )
    }

    fn sync(&self) -> Result<(), StoreError> {
        // Every change is durable on a majority once proposed.
        Ok(())
    }

    fn open_append(&self, name: &str) -> Result<Box<dyn AppendFile>, StoreError> {
        if !self.local.list()?.iter().any(|n| n == name) {
            self.propose(
                name,
                Change::WriteAt {
                    name: name.to_owned(),
                    at: 0,
                    bytes: Vec::new(),
                },
            )?;
        }
        Ok(Box::new(Appending {
            dir: self.clone_handle(),
            name: name.to_owned(),
        }))
    }
}

impl ReplicatedDirectory {
    fn clone_handle(&self) -> Arc<ReplicatedDirectory> {
        Arc::new(ReplicatedDirectory {
            local: self.local.clone(),
            raft: self.raft.clone(),
            runtime: self.runtime.clone(),
            timeout: self.timeout,
            failed: self.failed.clone(),
        })
    }
}

/// The most bytes one entry carries of a file written whole: a larger
/// file goes in pieces ([`Change::Rename`]).
const PIECE_BYTES: usize = 1 << 20;

/// A file being written: proposed whole when committed.
struct Staged {
    dir: Arc<ReplicatedDirectory>,
    name: String,
    bytes: Vec<u8>,
}

impl FileWriter for Staged {
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<(), StoreError> {
        let Staged { dir, name, bytes } = *self;
        if bytes.len() <= PIECE_BYTES {
            return dir.propose(&name.clone(), Change::Write { name, bytes });
        }
        // One entry per piece: each is written on a follower well within
        // the time Raft gives one message (its heartbeat interval).
        let staging = format!("{name}.staging");
        dir.propose(
            &staging,
            Change::Truncate {
                name: staging.clone(),
                len: 0,
            },
        )?;
        for (i, piece) in bytes.chunks(PIECE_BYTES).enumerate() {
            dir.propose(
                &staging,
                Change::WriteAt {
                    name: staging.clone(),
                    at: (i * PIECE_BYTES) as u64,
                    bytes: piece.to_vec(),
                },
            )?;
        }
        dir.propose(
            &name.clone(),
            Change::Rename {
                from: staging,
                to: name,
            },
        )
    }
}

/// An append-only file: each write and cut proposed.
struct Appending {
    dir: Arc<ReplicatedDirectory>,
    name: String,
}

impl AppendFile for Appending {
    fn write_at(&mut self, at: u64, bytes: &[u8]) -> Result<(), StoreError> {
        self.dir.propose(
            &self.name,
            Change::WriteAt {
                name: self.name.clone(),
                at,
                bytes: bytes.to_vec(),
            },
        )
    }

    fn truncate(&mut self, len: u64) -> Result<(), StoreError> {
        self.dir.propose(
            &self.name,
            Change::Truncate {
                name: self.name.clone(),
                len,
            },
        )
    }
}
