//! The client a DBMS (and the `bitfold` command) links: a blocking facade
//! over one connection to the master, in two kinds with the same calls.
//!
//! - A [`Client`] runs its connection on a thread of its own (capnp-rpc
//!   objects cannot cross threads), so it can be used from any plain
//!   thread, shared between threads, and called from inside an async
//!   runtime.
//! - A [`LocalClient`] is run by the thread that calls it: no thread
//!   between the caller and the socket, so each call costs two thread
//!   wake-ups less; it stays on the thread that made it.
//!
//! Several of either can live in one process. A broken connection is
//! re-established on the next call.
//!
//! A replicated cluster has several masters, one of which leads: give
//! them all, separated by commas (`"10.0.0.9:7100,10.0.0.10:7100"`). A
//! client uses one at a time; when it is down or not the leader, the call
//! goes to the next one (or the leader it names), and while none leads
//! (an election takes about a second) the masters are tried in turn for
//! up to [`DEFAULT_FAILOVER`] before the call fails as `unavailable`.
//!
//! ```no_run
//! use bitfold_engine::VectorBuf;
//! use bitfold_client::{Answer, Client, Format};
//!
//! let client = Client::connect("127.0.0.1:7100")?;
//! let v = VectorBuf::from_bits(vec![1, 5, 9]);
//! client.import(&[(42, v.as_part())])?;
//! assert!(matches!(client.query("P:42", Format::Count)?, Answer::Count(3)));
//! # Ok::<(), bitfold_client::Error>(())
//! ```

//! The files: `answer.rs` (the [`Format`] asked for and the [`Answer`]),
//! `error.rs` (the [`Error`] of a call and the master's [`ErrorKind`]),
//! `status.rs` (the [`SlaveStatus`] of each slave, the [`MasterState`] of
//! each master and their [`Traffic`]), `import.rs` (a batch cut into import
//! messages), `link.rs` (the connection to the master, moving between
//! masters, and the client thread), and `local.rs` (the
//! [`LocalClient`]). This file holds the calls both kinds offer and the
//! [`Client`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod answer;
mod error;
mod import;
mod link;
mod status;

use std::fmt;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use bitfold_engine::VectorPart;
use tokio::sync::mpsc as tokio_mpsc;

pub use answer::{Answer, Format};
/// The bytes of a vector answer ([`Answer::Words`], [`Answer::Roaring`]).
pub use bytes::Bytes;
pub use error::{Error, ErrorKind};
pub use status::{MasterState, MoveProgress, PlacementReport, SlaveStatus, Status, Traffic};

use bitfold_net as net;
use bitfold_net::tls::{self, Tls};
use bitfold_proto::{bitfold_capnp, wire};
use import::import_messages;
use link::{Call, Patience, Reply, serve_calls};

/// How long a call waits for the master by default: above the master's
/// own 30 s query deadline, so the master's error arrives first.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a client given several masters tries them in turn, from a
/// call's first failure, before the call fails as `unavailable`: above an
/// election's usual second.
pub const DEFAULT_FAILOVER: Duration = Duration::from_secs(5);

/// The calls of a client to the master, the same on [`Client`] and
/// [`LocalClient`]: each is built as a [`Call`] and carried by the type's own
/// `call`.
macro_rules! calls {
    () => {
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

        /// Clears the bits of every `(vid, vector)` that exists (docs/protocol.md
        /// §8); returns how many vectors lost a bit. When it returns `Ok`, every
        /// owner and the master hold the change. A large batch travels as
        /// several messages, each applied whole; if one fails, the earlier ones
        /// stay applied (clearing again is harmless).
        pub fn clear(&self, batch: &[(u64, VectorPart<'_>)]) -> Result<u64, Error> {
            let mut changed = 0;
            for message in import_messages(batch) {
                changed += self.call(|reply| Call::Clear { message, reply })?;
            }
            Ok(changed)
        }

        /// Deletes every existing vector whose vid lies in one of `spans`
        /// (`(first, last)`, inclusive); returns how many there were. Deleting
        /// what does not exist is not an error.
        pub fn delete(&self, spans: &[(u64, u64)]) -> Result<u64, Error> {
            self.call(|reply| Call::Delete {
                spans: spans.to_vec(),
                reply,
            })
        }

        /// What every slave has read and sent since it started, added up (from
        /// [`status`](Self::status)): the difference of two calls is what happened between.
        pub fn traffic(&self) -> Result<Traffic, Error> {
            let slaves = self.status()?;
            Ok(Traffic {
                read_bytes: slaves.iter().map(|s| s.read_bytes).sum(),
                sent_bytes: slaves.iter().map(|s| s.sent_bytes).sum(),
            })
        }

        /// Moves up to `most` vectors towards the layout of the master's
        /// cluster file (docs/protocol.md §9); call it until the progress says
        /// `finished`. Interrupted, a move resumes where it stopped.
        pub fn rebalance(&self, most: u32) -> Result<MoveProgress, Error> {
            self.call(|reply| Call::Rebalance { most, reply })
        }

        /// How well the vectors are placed: copies missing, a move in progress.
        pub fn placement(&self) -> Result<PlacementReport, Error> {
            self.call(|reply| Call::Placement { reply })
        }

        /// The state of every slave, in cluster file order.
        pub fn status(&self) -> Result<Vec<SlaveStatus>, Error> {
            Ok(self.full_status()?.slaves)
        }

        /// The state of every slave and, in a replicated cluster, of every
        /// master; and when the master's certificate expires.
        pub fn full_status(&self) -> Result<Status, Error> {
            self.call(|reply| Call::Status { reply })
        }
    };
}

mod local;

pub use local::LocalClient;

/// A connection to the master; cheap to share between threads.
pub struct Client {
    calls: Option<tokio_mpsc::UnboundedSender<(Call, Patience)>>,
    thread: Option<thread::JoinHandle<()>>,
    patience: Patience,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.patience.timeout)
            .field("failover", &self.patience.failover)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the master at `addr` (`HOST:PORT`), or to one of the
    /// masters of a list (`HOST:PORT,HOST:PORT,...`).
    pub fn connect(addr: &str) -> Result<Client, Error> {
        Client::start(addr, None)
    }

    /// Connects to the master at `addr` (or one of a list, as
    /// [`connect`](Self::connect)) over mutual TLS (docs/protocol.md §11):
    /// `tls` holds the cluster's CA and this client's certificate and key.
    pub fn connect_tls(addr: &str, tls: &Tls) -> Result<Client, Error> {
        Client::start(addr, Some(tls.clone()))
    }

    fn start(addr: &str, tls: Option<Tls>) -> Result<Client, Error> {
        let (calls, inbox) = tokio_mpsc::unbounded_channel();
        let (ready, connected) = mpsc::sync_channel(1);
        let owned = addr.to_owned();
        let thread = thread::Builder::new()
            .name(format!("bitfold-client {addr}"))
            .spawn(move || serve_calls(owned, tls, inbox, ready))
            .map_err(|e| {
                Error::unreachable(addr, format!("cannot start the client thread: {e}"))
            })?;
        let mut client = Client {
            calls: Some(calls),
            thread: Some(thread),
            patience: Patience::default(),
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
        self.patience.timeout = timeout;
    }

    /// Sets how long a call tries several masters in turn while none leads
    /// (default [`DEFAULT_FAILOVER`]).
    pub fn set_failover(&mut self, failover: Duration) {
        self.patience.failover = failover;
    }

    fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Call) -> Result<T, Error> {
        let (reply, answer) = mpsc::sync_channel(1);
        let lost = || Error::Protocol("the client thread stopped".into());
        self.calls
            .as_ref()
            .ok_or_else(lost)?
            .send((make(reply), self.patience))
            .map_err(|_| lost())?;
        answer.recv().map_err(|_| lost())?
    }

    calls!();
}

impl Drop for Client {
    fn drop(&mut self) {
        self.calls = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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
}
