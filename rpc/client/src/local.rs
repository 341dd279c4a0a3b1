//! [`LocalClient`]: the client facade run by the thread that calls it.

use std::fmt;
use std::future::Future;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use bitfold_engine::VectorPart;
use tokio::runtime::Runtime;
use tokio::task::LocalSet;

use super::import::import_messages;
use super::link::{Call, Link, Patience, Reply};
use super::{Answer, Error, Format, MoveProgress, PlacementReport};
use super::{SlaveStatus, Status, Traffic};
use crate::net;
use crate::tls::Tls;

/// A connection to the master that the calling thread runs itself.
///
/// A [`Client`](super::Client) hands each call to a thread of its own and
/// waits for it there: two thread wake-ups per call. A `LocalClient` runs
/// the connection on the caller's thread for the length of each call, so
/// an answer wakes only the caller (at 16 vids per term, 7-23% more
/// queries per second, measured in
/// benches/runs/2026-12-02-client-on-caller-thread.md). The price: it cannot
/// leave the thread that made it (open one per thread), its calls cannot
/// overlap, and a call made inside an async runtime is refused
/// ([`Error::InsideRuntime`]) rather than blocking the runtime. Between
/// calls nothing reads the connection; a broken one is re-established on
/// the next call, as a `Client` does.
pub struct LocalClient {
    link: Rc<Link>,
    local: LocalSet,
    runtime: Runtime,
    patience: Patience,
}

impl fmt::Debug for LocalClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalClient")
            .field("timeout", &self.patience.timeout)
            .field("failover", &self.patience.failover)
            .finish_non_exhaustive()
    }
}

impl LocalClient {
    /// Connects to the master at `addr` (`HOST:PORT`), or to one of the
    /// masters of a list (`HOST:PORT,HOST:PORT,...`).
    pub fn connect(addr: &str) -> Result<LocalClient, Error> {
        LocalClient::start(addr, None)
    }

    /// Connects to the master at `addr` (or one of a list) over mutual TLS (docs/protocol.md §11):
    /// `tls` holds the cluster's CA and this client's certificate and key.
    pub fn connect_tls(addr: &str, tls: &Tls) -> Result<LocalClient, Error> {
        LocalClient::start(addr, Some(tls.clone()))
    }

    fn start(addr: &str, tls: Option<Tls>) -> Result<LocalClient, Error> {
        let (runtime, local) = net::local_runtime().map_err(|e| Error::Connect {
            addr: addr.to_owned(),
            reason: format!("cannot start the client's runtime: {e}"),
        })?;
        let client = LocalClient {
            link: Rc::new(Link::new(addr, tls)),
            local,
            runtime,
            patience: Patience::default(),
        };
        client.run(client.link.connect())??;
        Ok(client)
    }

    /// Sets how long a call waits for the master (default [`DEFAULT_TIMEOUT`](super::DEFAULT_TIMEOUT)).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.patience.timeout = timeout;
    }

    /// Sets how long a call tries several masters in turn while none leads
    /// (default [`DEFAULT_FAILOVER`](super::DEFAULT_FAILOVER)).
    pub fn set_failover(&mut self, failover: Duration) {
        self.patience.failover = failover;
    }

    /// Runs `work` on this thread, unless the thread runs an async runtime.
    fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Error::InsideRuntime);
        }
        Ok(self.local.block_on(&self.runtime, work))
    }

    fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Call) -> Result<T, Error> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.run(async {
            // What came while no call ran (a master that closed the
            // connection) is read first, so that the call reconnects: one
            // turn for the runtime to see the socket's events, one for the
            // connection's tasks to read them.
            for _ in 0..2 {
                tokio::task::yield_now().await;
            }
            self.link.run(make(reply), self.patience).await;
        })?;
        answer
            .try_recv()
            .map_err(|_| Error::Protocol("a call ended without an answer".into()))?
    }

    calls!();
}
