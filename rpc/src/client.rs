//! The client a DBMS (and the `bitfold` command) links: a blocking facade
//! over one connection to the master.
//!
//! Each [`Client`] runs its connection on a thread of its own (capnp-rpc
//! objects cannot cross threads), so it can be used from any plain thread,
//! shared between threads, and several can live in one process. A broken
//! connection is re-established on the next call.
//!
//! ```no_run
//! use bitfold_engine::VectorBuf;
//! use bitfold_rpc::client::{Answer, Client, Format};
//!
//! let client = Client::connect("127.0.0.1:7100")?;
//! let v = VectorBuf::from_bits(vec![1, 5, 9]);
//! client.import(&[(42, v.as_part())])?;
//! assert!(matches!(client.query("P:42", Format::Count)?, Answer::Count(3)));
//! # Ok::<(), bitfold_rpc::client::Error>(())
//! ```

use std::fmt;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime};

use bitfold_engine::VectorPart;
use tokio::sync::mpsc as tokio_mpsc;

use crate::bitfold_capnp::{Format as WireFormat, error, master, outcome, result, vid_vector};
use crate::net::{self, Connection};
use crate::wire;

/// The form of a query's answer (docs/protocol.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Format {
    /// The dense little-endian `u64` words, trailing zero words trimmed.
    Words,
    /// The portable Roaring serialization.
    Roaring,
    /// Only the number of set bits.
    Count,
}

/// A query's answer, in the form asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The dense words as bytes (a multiple of 8; empty for the empty vector).
    Words(Vec<u8>),
    /// The portable Roaring serialization.
    Roaring(Vec<u8>),
    /// The number of set bits.
    Count(u64),
}

/// The kinds of error the master answers (docs/protocol.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The query message is malformed; the message gives the byte offset.
    BadQuery,
    /// A point query named a vector that does not exist.
    NotFound,
    /// Some needed vector has no live owner; the failed machines are named.
    Unavailable,
    /// A bug or an unexpected condition in bitfold.
    Internal,
    /// The answer does not fit one Cap'n Proto `Data`; ask for `count` or `roaring`.
    TooLarge,
}

impl ErrorKind {
    pub(crate) fn from_wire(kind: crate::bitfold_capnp::ErrorKind) -> ErrorKind {
        use crate::bitfold_capnp::ErrorKind as W;
        match kind {
            W::BadQuery => ErrorKind::BadQuery,
            W::NotFound => ErrorKind::NotFound,
            W::Unavailable => ErrorKind::Unavailable,
            W::Internal => ErrorKind::Internal,
            W::TooLarge => ErrorKind::TooLarge,
        }
    }

    pub(crate) fn to_wire(self) -> crate::bitfold_capnp::ErrorKind {
        use crate::bitfold_capnp::ErrorKind as W;
        match self {
            ErrorKind::BadQuery => W::BadQuery,
            ErrorKind::NotFound => W::NotFound,
            ErrorKind::Unavailable => W::Unavailable,
            ErrorKind::Internal => W::Internal,
            ErrorKind::TooLarge => W::TooLarge,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::BadQuery => "bad query",
            ErrorKind::NotFound => "not found",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal error",
            ErrorKind::TooLarge => "too large",
        })
    }
}

/// Why a call failed. `Display` is one line a user can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The master answered with an error.
    #[error("{message}")]
    Query {
        /// What kind of error.
        kind: ErrorKind,
        /// The master's message (`bad query at byte 5: expected a digit after '-'`).
        message: String,
        /// The machines that failed or are down, for `Unavailable`.
        failed_machines: Vec<String>,
    },
    /// The master could not be reached.
    #[error("cannot reach the master at {addr}: {reason}")]
    Connect {
        /// The master's address.
        addr: String,
        /// Why (connection refused, no answer in time, ...) and what to do.
        reason: String,
    },
    /// The master's answer made no sense (a version mismatch or a bug).
    #[error("unexpected answer from the master: {0}")]
    Protocol(String),
}

impl Error {
    /// A master that did not answer at `addr`: the fix is to start it.
    fn unreachable(addr: &str, why: impl fmt::Display) -> Error {
        Error::Connect {
            addr: addr.to_owned(),
            reason: format!("{why} (start it with `bitfold up`)"),
        }
    }

    pub(crate) fn read(reader: error::Reader<'_>) -> Error {
        let text = |t: capnp::Result<capnp::text::Reader<'_>>| {
            t.ok()
                .and_then(|t| t.to_str().ok())
                .unwrap_or("?")
                .to_owned()
        };
        let failed_machines = match reader.get_failed_machines() {
            Ok(list) => list.iter().map(&text).collect(),
            Err(_) => Vec::new(),
        };
        match reader.get_kind() {
            Ok(kind) => Error::Query {
                kind: ErrorKind::from_wire(kind),
                message: text(reader.get_message()),
                failed_machines,
            },
            Err(_) => Error::Protocol("an error of an unknown kind".into()),
        }
    }

    /// The kind of a query error, if the master answered one.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Error::Query { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

/// One slave as the master sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlaveStatus {
    /// Its name in the cluster file.
    pub name: String,
    /// Its address.
    pub addr: String,
    /// Whether it answers.
    pub up: bool,
    /// Since when it is up or down (as the master saw it).
    pub since: SystemTime,
    /// How many vectors it holds (last known).
    pub vectors: u64,
    /// Bytes of its data files (last known).
    pub bytes: u64,
    /// Bytes of vectors its folds have read since it started (last known).
    pub read_bytes: u64,
    /// Bytes it has sent to other processes since it started (last known).
    pub sent_bytes: u64,
    /// Why it is down.
    pub reason: Option<String>,
}

/// Bytes the slaves of a cluster read and sent, added up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes of stored vectors their folds read.
    pub read_bytes: u64,
    /// Bytes they sent to other processes.
    pub sent_bytes: u64,
}

impl Traffic {
    /// What was read and sent after `before`.
    pub fn since(self, before: Traffic) -> Traffic {
        Traffic {
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            sent_bytes: self.sent_bytes.saturating_sub(before.sent_bytes),
        }
    }
}

/// The most vector bytes one import message carries; a larger batch is
/// sent as several messages (a single vector may exceed it, in its own).
const IMPORT_MESSAGE_BYTES: usize = 64 << 20;

/// How long a call waits for the master by default: above the master's
/// own 30 s query deadline, so the master's error arrives first.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

type Reply<T> = mpsc::SyncSender<Result<T, Error>>;

enum Call {
    Query {
        message: String,
        format: Format,
        reply: Reply<Answer>,
    },
    Import {
        message: capnp::message::Builder<capnp::message::HeapAllocator>,
        reply: Reply<()>,
    },
    Status {
        reply: Reply<Vec<SlaveStatus>>,
    },
}

/// A connection to the master; cheap to share between threads.
pub struct Client {
    calls: Option<tokio_mpsc::UnboundedSender<(Call, Duration)>>,
    thread: Option<thread::JoinHandle<()>>,
    timeout: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the master at `addr` (`HOST:PORT`).
    pub fn connect(addr: &str) -> Result<Client, Error> {
        let (calls, inbox) = tokio_mpsc::unbounded_channel();
        let (ready, connected) = mpsc::sync_channel(1);
        let owned = addr.to_owned();
        let thread = thread::Builder::new()
            .name(format!("bitfold-client {addr}"))
            .spawn(move || serve_calls(owned, inbox, ready))
            .map_err(|e| {
                Error::unreachable(addr, format!("cannot start the client thread: {e}"))
            })?;
        let mut client = Client {
            calls: Some(calls),
            thread: Some(thread),
            timeout: DEFAULT_TIMEOUT,
        };
        match connected.recv() {
            Ok(Ok(())) => Ok(client),
            Ok(Err(err)) => Err(err),
            Err(_) => {
                client.calls = None;
                Err(Error::unreachable(addr, "the client thread stopped"))
            }
        }
    }

    /// Sets how long a call waits for the master (default [`DEFAULT_TIMEOUT`]).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Call) -> Result<T, Error> {
        let (reply, answer) = mpsc::sync_channel(1);
        let lost = || Error::Protocol("the client thread stopped".into());
        self.calls
            .as_ref()
            .ok_or_else(lost)?
            .send((make(reply), self.timeout))
            .map_err(|_| lost())?;
        answer.recv().map_err(|_| lost())?
    }

    /// Runs a query message (`P:vid` or `R:t1&t2&...`) and returns its answer in `format`.
    pub fn query(&self, message: &str, format: Format) -> Result<Answer, Error> {
        self.call(|reply| Call::Query {
            message: message.to_owned(),
            format,
            reply,
        })
    }

    /// Sets the bits of every `(vid, vector)` (vids may repeat). When it
    /// returns `Ok`, every vector is durable on all its owners and in the
    /// master's catalog. A large batch travels as several messages; if one
    /// fails, the earlier ones stay applied (importing again is harmless).
    pub fn import(&self, batch: &[(u64, VectorPart<'_>)]) -> Result<(), Error> {
        for message in import_messages(batch) {
            self.call(|reply| Call::Import { message, reply })?;
        }
        Ok(())
    }

    /// What every slave has read and sent since it started, added up (from
    /// [`Client::status`]): the difference of two calls is what happened between.
    pub fn traffic(&self) -> Result<Traffic, Error> {
        let slaves = self.status()?;
        Ok(Traffic {
            read_bytes: slaves.iter().map(|s| s.read_bytes).sum(),
            sent_bytes: slaves.iter().map(|s| s.sent_bytes).sum(),
        })
    }

    /// The state of every slave, in cluster file order.
    pub fn status(&self) -> Result<Vec<SlaveStatus>, Error> {
        self.call(|reply| Call::Status { reply })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.calls = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Splits an import batch into messages of about [`IMPORT_MESSAGE_BYTES`].
fn import_messages(
    batch: &[(u64, VectorPart<'_>)],
) -> Vec<capnp::message::Builder<capnp::message::HeapAllocator>> {
    let size = |part: &VectorPart<'_>| {
        part.dense_words().len() * 8 + part.sparse_values().len() * 2 + part.container_count() * 6
    };
    let mut groups: Vec<Vec<(u64, Vec<VectorPart<'_>>)>> = vec![Vec::new()];
    let mut bytes = 0;
    for (vid, part) in batch {
        let part_bytes = size(part);
        if bytes + part_bytes > IMPORT_MESSAGE_BYTES && bytes > 0 {
            groups.push(Vec::new());
            bytes = 0;
        }
        bytes += part_bytes;
        let group = groups.last_mut().expect("there is always a group");
        group.push((*vid, wire::pieces(part)));
    }
    groups
        .into_iter()
        .filter(|group| !group.is_empty())
        .map(|group| {
            let mut message = capnp::message::Builder::new_default();
            let mut list: capnp::struct_list::Builder<'_, vid_vector::Owned> =
                message.initn_root(group.len() as u32);
            for (i, (vid, pieces)) in group.iter().enumerate() {
                let mut entry = list.reborrow().get(i as u32);
                entry.set_vid(*vid);
                let mut parts = entry.init_parts(pieces.len() as u32);
                for (j, piece) in pieces.iter().enumerate() {
                    wire::write_part(parts.reborrow().get(j as u32), piece);
                }
            }
            message
        })
        .collect()
}

/// The client thread: connects, reports, then serves calls until the
/// [`Client`] is dropped.
fn serve_calls(
    addr: String,
    mut inbox: tokio_mpsc::UnboundedReceiver<(Call, Duration)>,
    ready: mpsc::SyncSender<Result<(), Error>>,
) {
    let ran = net::block_on_local(async move {
        let link = std::rc::Rc::new(Link {
            addr: addr.clone(),
            connection: std::cell::RefCell::new(None),
        });
        let first = link.client().await.map(|_| ());
        let failed = first.is_err();
        let _ = ready.send(first);
        if failed {
            return;
        }
        while let Some((call, timeout)) = inbox.recv().await {
            let link = link.clone();
            tokio::task::spawn_local(async move { link.run(call, timeout).await });
        }
    });
    if let Err(err) = ran {
        tracing::error!("the client thread could not start its runtime: {err}");
    }
}

/// The connection to the master, re-established after a failure.
struct Link {
    addr: String,
    connection: std::cell::RefCell<Option<std::rc::Rc<Connection<master::Client>>>>,
}

impl Link {
    async fn client(&self) -> Result<std::rc::Rc<Connection<master::Client>>, Error> {
        if let Some(connection) = self.connection.borrow().as_ref() {
            // A master that was restarted closed the old connection: reconnect.
            if !connection.is_closed() {
                return Ok(connection.clone());
            }
        }
        let connect = tokio::time::timeout(
            Duration::from_secs(10),
            net::connect(&self.addr, net::Sent::default()),
        );
        let connection = match connect.await {
            Ok(Ok(connection)) => std::rc::Rc::new(connection),
            // Not `HOST:PORT` (no port, a port above 65535): nothing to start.
            Ok(Err(err)) if err.kind() == std::io::ErrorKind::InvalidInput => {
                return Err(Error::Connect {
                    addr: self.addr.clone(),
                    reason: format!("{} (give it as HOST:PORT)", net::describe_io(&err)),
                });
            }
            Ok(Err(err)) => return Err(self.connect_error(net::describe_io(&err))),
            Err(_) => return Err(self.connect_error("no answer within 10 s".into())),
        };
        *self.connection.borrow_mut() = Some(connection.clone());
        Ok(connection)
    }

    fn connect_error(&self, reason: String) -> Error {
        Error::unreachable(&self.addr, reason)
    }

    /// A failed call: drop the connection so the next call reconnects.
    fn lost(&self, err: capnp::Error) -> Error {
        *self.connection.borrow_mut() = None;
        match err.kind {
            capnp::ErrorKind::Disconnected => {
                self.connect_error(format!("connection lost ({err})"))
            }
            _ => Error::Protocol(err.to_string()),
        }
    }

    async fn run(&self, call: Call, timeout: Duration) {
        match call {
            Call::Query {
                message,
                format,
                reply,
            } => {
                let answer = self.within(timeout, self.query(&message, format)).await;
                let _ = reply.send(answer);
            }
            Call::Import { message, reply } => {
                let _ = reply.send(self.within(timeout, self.import(message)).await);
            }
            Call::Status { reply } => {
                let _ = reply.send(self.within(timeout, self.status()).await);
            }
        }
    }

    /// `work`, or a connect error when the master does not answer in time.
    async fn within<T>(
        &self,
        timeout: Duration,
        work: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => {
                *self.connection.borrow_mut() = None;
                Err(self.connect_error(format!("no answer within {}", net::seconds(timeout))))
            }
        }
    }

    async fn query(&self, message: &str, format: Format) -> Result<Answer, Error> {
        let connection = self.client().await?;
        let mut request = connection.client.query_request();
        request.get().set_message(message);
        request.get().set_format(match format {
            Format::Words => WireFormat::Words,
            Format::Roaring => WireFormat::Roaring,
            Format::Count => WireFormat::Count,
        });
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        let answer = (|| -> capnp::Result<Result<Answer, Error>> {
            let result = response.get()?.get_result()?;
            Ok(match result.which()? {
                result::Words(words) => Ok(Answer::Words(words?.to_vec())),
                result::Roaring(bytes) => Ok(Answer::Roaring(bytes?.to_vec())),
                result::Count(count) => Ok(Answer::Count(count)),
                result::Error(error) => Err(Error::read(error?)),
            })
        })();
        answer.map_err(|e| Error::Protocol(e.to_string()))?
    }

    async fn import(
        &self,
        message: capnp::message::Builder<capnp::message::HeapAllocator>,
    ) -> Result<(), Error> {
        let connection = self.client().await?;
        let mut request = connection.client.import_request();
        let vectors = message
            .get_root_as_reader()
            .map_err(|e| Error::Protocol(e.to_string()))?;
        request
            .get()
            .set_vectors(vectors)
            .map_err(|e| Error::Protocol(e.to_string()))?;
        drop(message);
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        let outcome = (|| -> capnp::Result<Result<(), Error>> {
            Ok(match response.get()?.get_outcome()?.which()? {
                outcome::Ok(()) => Ok(()),
                outcome::Error(error) => Err(Error::read(error?)),
            })
        })();
        outcome.map_err(|e| Error::Protocol(e.to_string()))?
    }

    async fn status(&self) -> Result<Vec<SlaveStatus>, Error> {
        let connection = self.client().await?;
        let request = connection.client.status_request();
        let response = request.send().promise.await.map_err(|e| self.lost(e))?;
        let slaves = (|| -> capnp::Result<Vec<SlaveStatus>> {
            let list = response.get()?.get_slaves()?;
            list.iter()
                .map(|s| {
                    let millis = s.get_since_unix_millis();
                    let since = if millis >= 0 {
                        SystemTime::UNIX_EPOCH + Duration::from_millis(millis as u64)
                    } else {
                        SystemTime::UNIX_EPOCH
                    };
                    let reason = s.get_reason()?.to_string()?;
                    Ok(SlaveStatus {
                        name: s.get_name()?.to_string()?,
                        addr: s.get_addr()?.to_string()?,
                        up: s.get_up(),
                        since,
                        vectors: s.get_vectors(),
                        bytes: s.get_bytes(),
                        read_bytes: s.get_read_bytes(),
                        sent_bytes: s.get_sent_bytes(),
                        reason: (!reason.is_empty()).then_some(reason),
                    })
                })
                .collect()
        })();
        slaves.map_err(|e| Error::Protocol(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Client>();
    }

    #[test]
    fn big_imports_are_cut_into_messages() {
        let dense = bitfold_engine::VectorBuf::from_sorted_bits(&(0..1 << 22).collect::<Vec<_>>());
        let batch: Vec<_> = (0..40).map(|vid| (vid, dense.as_part())).collect();
        let messages = import_messages(&batch);
        // 40 vectors of 512 KiB in messages of at most 64 MiB.
        assert_eq!(messages.len(), 1);
        let batch: Vec<_> = (0..300).map(|vid| (vid, dense.as_part())).collect();
        let messages = import_messages(&batch);
        assert_eq!(messages.len(), 3);
        let vids: usize = messages
            .iter()
            .map(|m| {
                m.get_root_as_reader::<capnp::struct_list::Reader<'_, vid_vector::Owned>>()
                    .unwrap()
                    .len() as usize
            })
            .sum();
        assert_eq!(vids, 300);
    }
}
