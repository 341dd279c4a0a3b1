//! The one place that owns the runtime, the accept loop and connection
//! setup, and the per-process pool of connections to slaves.
//!
//! capnp-rpc objects are `!Send`, so every process (and every client
//! facade) runs a current-thread tokio runtime with a `LocalSet`. Every
//! connection, both ends, sets `TCP_NODELAY` and raises the reader's
//! traversal limit to [`MAX_MESSAGE_WORDS`]: the default 64 MiB would reject
//! a large vector and tear down the whole connection.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use capnp::capability::FromClientHook;
use capnp::message::ReaderOptions;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{RpcSystem, twoparty};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use crate::bitfold_capnp::slave;

/// The largest message read, in 8-byte words (1 GiB): a vector with every
/// bit set is 512 MiB of dense words in parts, plus its keys.
pub const MAX_MESSAGE_WORDS: usize = 1 << 27;

/// Bytes a connection gathers before it sends: a message up to this size
/// (a partial result of a 2^20-bit term is 128 KiB) leaves in one send,
/// waking the peer once, instead of its small first segment in one send and
/// its large one in another.
const WRITE_BUFFER: usize = 256 << 10;

/// Reader options for every connection, both ends.
pub(crate) fn reader_options() -> ReaderOptions {
    let mut options = ReaderOptions::new();
    options.traversal_limit_in_words(Some(MAX_MESSAGE_WORDS));
    options
}

/// Runs `main` to completion on a fresh current-thread runtime, inside a `LocalSet`.
pub(crate) fn block_on_local<F: Future>(main: F) -> std::io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    Ok(local.block_on(&runtime, main))
}

/// Binds `listen` (`HOST:PORT`, port 0 for any free one).
pub(crate) async fn bind(listen: &str) -> Result<TcpListener, crate::Error> {
    TcpListener::bind(listen)
        .await
        .map_err(|cause| crate::Error::Bind {
            addr: listen.to_owned(),
            cause,
        })
}

/// Bytes a server's connections (accepted and its own, in its [`Pool`])
/// have written to their sockets: what it shipped to other processes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sent(Rc<Cell<u64>>);

impl Sent {
    /// Bytes written so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.0.get()
    }
}

/// A socket's write half that adds what it writes to a [`Sent`].
struct Counted<W> {
    inner: W,
    sent: Sent,
}

impl<W: futures::AsyncWrite + Unpin> futures::AsyncWrite for Counted<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = polled {
            self.sent.0.set(self.sent.0.get() + n as u64);
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_close(cx)
    }
}

/// The most connections one peer (one IP address) may hold open to a
/// server at once. A connection over it is served a capability whose every
/// call fails with an error saying so; one over twice it is closed at once.
pub const MAX_CONNECTIONS_PER_PEER: usize = 256;

/// Serves `bootstrap` to every connection accepted on `listener`, forever,
/// counting what they send in `sent`; at most [`MAX_CONNECTIONS_PER_PEER`]
/// connections of one peer are served at a time.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    bootstrap: capnp::capability::Client,
    sent: Sent,
) {
    accept_at_most(listener, bootstrap, sent, MAX_CONNECTIONS_PER_PEER).await;
}

/// [`accept_loop`] with `most` connections per peer.
async fn accept_at_most(
    listener: TcpListener,
    bootstrap: capnp::capability::Client,
    sent: Sent,
    most: usize,
) {
    let open: Rc<RefCell<HashMap<IpAddr, usize>>> = Rc::default();
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let held = open.borrow().get(&peer.ip()).copied().unwrap_or(0);
                if held >= 2 * most {
                    tracing::warn!(%peer, "closed a connection: the peer holds {held} already");
                    continue;
                }
                let served = if held >= most {
                    tracing::warn!(%peer, "refused a connection: the peer holds {held} already");
                    capnp_rpc::new_broken_cap(capnp::Error::failed(format!(
                        "too many connections from {}: a peer may hold at most {most} at once                          (close some, or reuse one)",
                        peer.ip()
                    )))
                } else {
                    tracing::debug!(%peer, "accepted a connection");
                    bootstrap.clone()
                };
                *open.borrow_mut().entry(peer.ip()).or_default() += 1;
                let system =
                    RpcSystem::new(network(stream, Side::Server, sent.clone()), Some(served));
                let open = open.clone();
                tokio::task::spawn_local(async move {
                    if let Err(err) = system.await {
                        tracing::debug!("connection ended: {err}");
                    }
                    let mut open = open.borrow_mut();
                    if let Some(count) = open.get_mut(&peer.ip()) {
                        *count -= 1;
                        if *count == 0 {
                            open.remove(&peer.ip());
                        }
                    }
                });
            }
            Err(err) => {
                // Out of file descriptors and the like: wait and go on.
                tracing::warn!("accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn network(stream: TcpStream, side: Side, sent: Sent) -> Box<dyn capnp_rpc::VatNetwork<Side>> {
    if let Err(err) = stream.set_nodelay(true) {
        tracing::warn!("cannot set TCP_NODELAY: {err}");
    }
    let (reader, writer) = stream.into_split();
    Box::new(twoparty::VatNetwork::new(
        futures::io::BufReader::new(reader.compat()),
        futures::io::BufWriter::with_capacity(
            WRITE_BUFFER,
            Counted {
                inner: writer.compat_write(),
                sent,
            },
        ),
        side,
        reader_options(),
    ))
}

/// Runs `system` until its connection ends, then raises `closed`.
fn spawn_system(system: RpcSystem<Side>, closed: Rc<Cell<bool>>) -> JoinHandle<()> {
    tokio::task::spawn_local(async move {
        if let Err(err) = system.await {
            tracing::debug!("connection ended: {err}");
        }
        closed.set(true);
    })
}

/// A connection to a server and its bootstrap capability; dropping it
/// closes the connection.
pub(crate) struct Connection<C> {
    /// The server's bootstrap capability.
    pub(crate) client: C,
    task: JoinHandle<()>,
    closed: Rc<Cell<bool>>,
}

impl<C> Connection<C> {
    /// Whether the peer closed the connection (a restarted or killed server).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.get()
    }
}

impl<C> Drop for Connection<C> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects to `addr` and bootstraps its capability; what the connection
/// sends is counted in `sent`.
pub(crate) async fn connect<C: FromClientHook>(
    addr: &str,
    sent: Sent,
) -> std::io::Result<Connection<C>> {
    let stream = TcpStream::connect(addr).await?;
    let mut system = RpcSystem::new(network(stream, Side::Client, sent), None);
    let client = system.bootstrap(Side::Server);
    let closed = Rc::new(Cell::new(false));
    Ok(Connection {
        client,
        task: spawn_system(system, closed.clone()),
        closed,
    })
}

/// Open connections to slaves, by address; one per process (per runtime).
///
/// A connection is evicted (and closed) when a call on it fails or times
/// out, so the next call reconnects.
#[derive(Default)]
pub(crate) struct Pool {
    connections: RefCell<HashMap<String, Rc<Connection<slave::Client>>>>,
    sent: Sent,
}

impl Pool {
    /// A pool whose connections count what they send in `sent`.
    pub(crate) fn counting(sent: Sent) -> Pool {
        Pool {
            connections: RefCell::default(),
            sent,
        }
    }

    async fn get(&self, addr: &str) -> std::io::Result<Rc<Connection<slave::Client>>> {
        if let Some(found) = self.connections.borrow().get(addr) {
            // A connection the peer closed (it was restarted) is replaced,
            // not blamed on the peer.
            if !found.is_closed() {
                return Ok(found.clone());
            }
        }
        let fresh = Rc::new(connect(addr, self.sent.clone()).await?);
        // Another call may have connected meanwhile: keep the first.
        let mut connections = self.connections.borrow_mut();
        let held = connections
            .entry(addr.to_owned())
            .and_modify(|held| {
                if held.is_closed() {
                    *held = fresh.clone();
                }
            })
            .or_insert(fresh);
        Ok(held.clone())
    }

    fn evict(&self, addr: &str, connection: Option<&Rc<Connection<slave::Client>>>) {
        let mut connections = self.connections.borrow_mut();
        let same = match (connections.get(addr), connection) {
            (Some(held), Some(used)) => Rc::ptr_eq(held, used),
            _ => false,
        };
        if same {
            connections.remove(addr);
        }
    }

    /// Calls the slave at `addr` with `call`, giving up after `timeout`
    /// (connecting included). Any failure evicts the connection and comes
    /// back as the reason the machine failed.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        addr: &str,
        timeout: Duration,
        call: F,
    ) -> Result<T, String>
    where
        F: FnOnce(slave::Client) -> Fut,
        Fut: Future<Output = capnp::Result<T>>,
    {
        let used = Cell::new(None);
        let attempt = async {
            let connection = self.get(addr).await.map_err(|e| describe_io(&e))?;
            used.set(Some(connection.clone()));
            call(connection.client.clone())
                .await
                .map_err(|e| e.to_string())
        };
        let result = match tokio::time::timeout(timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {}", seconds(timeout))),
        };
        if result.is_err() {
            self.evict(addr, used.take().as_ref());
        }
        result
    }
}

/// An I/O error for a one-line message: `connection refused`, without the OS error number.
pub(crate) fn describe_io(err: &std::io::Error) -> String {
    let text = err.to_string();
    let text = match text.find(" (os error ") {
        Some(cut) => &text[..cut],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text.to_owned(),
    }
}

/// `1.5 s`, `250 ms`: a duration for messages.
pub(crate) fn seconds(duration: Duration) -> String {
    if duration >= Duration::from_secs(1) {
        format!("{:.1} s", duration.as_secs_f64())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

/// The address a listener is bound to, for `on_ready`.
pub(crate) fn local_addr(listener: &TcpListener) -> Result<SocketAddr, crate::Error> {
    listener.local_addr().map_err(crate::Error::Io)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the server of `connection` answers a call with.
    async fn answer(connection: &Connection<slave::Client>) -> String {
        match connection.client.health_request().send().promise.await {
            Ok(_) => "a health report".to_owned(),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn a_peer_over_its_connection_bound_is_told_so_and_the_others_are_served() {
        block_on_local(async {
            let listener = bind("127.0.0.1:0").await.unwrap();
            let addr = local_addr(&listener).unwrap().to_string();
            let served = capnp_rpc::new_broken_cap(capnp::Error::failed("served".to_owned()));
            tokio::task::spawn_local(accept_at_most(listener, served, Sent::default(), 2));
            let connect = || connect::<slave::Client>(&addr, Sent::default());
            let first = connect().await.unwrap();
            let second = connect().await.unwrap();
            assert!(answer(&first).await.contains("served"));
            assert!(answer(&second).await.contains("served"));
            let third = connect().await.unwrap();
            let refused = answer(&third).await;
            assert!(
                refused.contains("too many connections from 127.0.0.1")
                    && refused.contains("at most 2"),
                "{refused}"
            );
            assert!(
                answer(&first).await.contains("served"),
                "the others are still served"
            );
        })
        .unwrap();
    }
}
