//! The one place that owns the runtime, the accept loop and connection
//! setup, and the per-process pool of connections to slaves.
//!
//! capnp-rpc objects are `!Send`, so every process (and every client
//! facade) runs a current-thread tokio runtime with a `LocalSet`. Every
//! connection, both ends, sets `TCP_NODELAY` and raises the reader's
//! traversal limit to [`MAX_MESSAGE_WORDS`]: the default 64 MiB would reject
//! a large vector and tear down the whole connection. A message announced
//! over that bound is refused before it is read, naming the bound.
//!
//! With a [`Tls`] configuration, every connection, accepted or made, is
//! wrapped in mutual TLS before Cap'n Proto sees it (docs/protocol.md §11):
//! `sealed` drives rustls's unbuffered API, and rustls seals and opens
//! every record; without one it is plain TCP, split without a lock.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use capnp::capability::FromClientHook;
use capnp_rpc::RpcSystem;
use capnp_rpc::rpc_twoparty_capnp::Side;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use bitfold_proto::bitfold_capnp::slave;

use crate::refusals::Refusals;
use crate::tls::{Identity, Role, Tls};

pub use handshake::{TlsStream, accept_tls};
pub use received::keep as keep_received;

pub mod framing;
mod handshake;
mod received;
mod refusals;
mod sealed;
pub mod tls;
mod vat;
mod writer;

// sealed's tests name this crate by its path in the old `bitfold-rpc`
// (`crate::net::block_on_local`).
#[cfg(test)]
use crate as net;

pub use bitfold_proto::{MAX_MESSAGE_WORDS, reader_options};

/// Bytes of small writes a connection gathers before it sends. A message
/// leaves in one send, waking the peer once: its table and small segments
/// from the buffer, its large ones (a partial result of a 2^20-bit term is
/// 128 KiB) from where they are, in the same vectored write.
const WRITE_BUFFER: usize = 256 << 10;

/// The longest a TLS handshake may take, either end: a peer that connects
/// and says nothing (or speaks plain Cap'n Proto) is dropped after it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A current-thread runtime and a `LocalSet` to run capnp-rpc on.
pub fn local_runtime() -> std::io::Result<(tokio::runtime::Runtime, tokio::task::LocalSet)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((runtime, tokio::task::LocalSet::new()))
}

/// Runs `main` to completion on a fresh [`local_runtime`].
pub fn block_on_local<F: Future>(main: F) -> std::io::Result<F::Output> {
    let (runtime, local) = local_runtime()?;
    Ok(local.block_on(&runtime, main))
}

/// Binds `listen` (`HOST:PORT`, port 0 for any free one). A listener on a
/// loopback address hands its connections an unpaced congestion control
/// (`unpaced_on_loopback`).
pub async fn bind(listen: &str) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(listen).await?;
    if let Ok(local) = listener.local_addr() {
        unpaced_on_loopback(&socket2::SockRef::from(&listener), local.ip());
    }
    Ok(listener)
}

/// Connects to `addr` (`HOST:PORT`), trying each address it resolves to as
/// `TcpStream::connect` does; a socket to a loopback address is given an
/// unpaced congestion control before it connects.
async fn open(addr: &str) -> std::io::Result<TcpStream> {
    let mut last = None;
    for target in tokio::net::lookup_host(addr).await? {
        let socket = if target.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        unpaced_on_loopback(&socket2::SockRef::from(&socket), target.ip());
        match socket.connect(target).await {
            // A dial to a loopback port nobody listens on, from that very
            // port, connects the socket to itself (TCP's simultaneous open),
            // and holds the port its server would start on again.
            Ok(stream) if stream.local_addr().ok() == Some(target) => {
                last = Some(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "nothing listens there (the connection reached itself)",
                ));
            }
            Ok(stream) => return Ok(stream),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}

/// Bytes a server's connections (accepted and its own, in its [`Pool`])
/// have written to their sockets: what it shipped to other processes.
#[derive(Debug, Clone, Default)]
pub struct Sent(Rc<Cell<u64>>);

impl Sent {
    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.0.get()
    }
}

/// A socket's write half, as the `futures` writer capnp-rpc wants, that
/// adds what it writes to a [`Sent`]. It passes vectored writes on as they
/// are (tokio-util's `Compat` sends only the first slice of one), so a
/// message's buffered pieces and its large segment leave in one send.
struct Counted<W> {
    inner: W,
    sent: Sent,
}

impl<W> Counted<W> {
    /// Adds what a write wrote to [`Sent`], and passes its outcome on.
    fn count(
        &self,
        polled: std::task::Poll<std::io::Result<usize>>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let std::task::Poll::Ready(Ok(n)) = polled {
            self.sent.0.set(self.sent.0.get() + n as u64);
        }
        polled
    }
}

impl<W: AsyncWrite + Unpin> futures::AsyncWrite for Counted<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.count(polled)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.count(polled)
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
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The most connections one peer (one IP address) may hold open to a
/// server at once. A connection over it is served a capability whose every
/// call fails with an error saying so; one over twice it is closed at once.
pub const MAX_CONNECTIONS_PER_PEER: usize = 256;

/// Who is at the other end of an accepted connection.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its address.
    pub addr: SocketAddr,
    /// Who its certificate says it is, on a TLS connection.
    pub identity: Option<Identity>,
}

/// Serves every connection accepted on `listener`, forever, the capability
/// `serve` gives its peer (or, if `serve` refuses it, closes it at once,
/// logging why at most once a minute per peer address), counting what they send in `sent`; at most
/// [`MAX_CONNECTIONS_PER_PEER`] connections of one peer are served at a
/// time. With `tls`, a connection is served only once its client presented
/// a certificate the cluster's CA signed and did not revoke, naming a role;
/// a refused one is logged with the peer's address and the reason.
pub async fn accept_loop(
    listener: TcpListener,
    serve: impl Fn(&Peer) -> Result<capnp::capability::Client, String> + 'static,
    sent: Sent,
    tls: Option<Tls>,
) {
    accept_at_most(
        listener,
        Rc::new(serve),
        sent,
        tls,
        MAX_CONNECTIONS_PER_PEER,
    )
    .await;
}

/// What a server gives each peer it accepts: its capability, or why not.
type Serve = dyn Fn(&Peer) -> Result<capnp::capability::Client, String>;

/// The connections each peer holds open.
type Open = Rc<RefCell<HashMap<IpAddr, usize>>>;

/// One connection counted against its peer until dropped.
struct Held {
    open: Open,
    peer: IpAddr,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.open.borrow_mut();
        if let Some(count) = open.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// [`accept_loop`] with `most` connections per peer.
async fn accept_at_most(
    listener: TcpListener,
    serve: Rc<Serve>,
    sent: Sent,
    tls: Option<Tls>,
    most: usize,
) {
    let open: Open = Rc::default();
    let refusals = Rc::new(RefCell::new(Refusals::default()));
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let held = open.borrow().get(&peer.ip()).copied().unwrap_or(0);
                if held >= 2 * most {
                    tracing::warn!(%peer, "closed a connection: the peer holds {held} already");
                    continue;
                }
                let too_many = (held >= most).then(|| {
                    tracing::warn!(%peer, "refused a connection: the peer holds {held} already");
                    capnp_rpc::new_broken_cap(capnp::Error::failed(format!(
                        "too many connections from {}: a peer may hold at most {most} at once \
                         (close some, or reuse one)",
                        peer.ip()
                    )))
                });
                *open.borrow_mut().entry(peer.ip()).or_default() += 1;
                let held = Held {
                    open: open.clone(),
                    peer: peer.ip(),
                };
                set_nodelay(&stream);
                let Some(tls) = &tls else {
                    let network = plain(stream, Side::Server, sent.clone());
                    let peer = Peer {
                        addr: peer,
                        identity: None,
                    };
                    begin(network, peer, too_many, &*serve, held, &refusals);
                    continue;
                };
                let sent = sent.clone();
                let serve = serve.clone();
                let refusals = refusals.clone();
                let tls = tls.clone();
                tokio::task::spawn_local(async move {
                    let (stream, identity) = match handshake::accept(&tls, stream).await {
                        Ok(accepted) => accepted,
                        Err(why) => {
                            tracing::warn!("refused a connection from {peer}: {why}");
                            return;
                        }
                    };
                    tracing::debug!(%peer, "accepted a connection from {identity}");
                    let network = encrypted(stream, Side::Server, sent);
                    let peer = Peer {
                        addr: peer,
                        identity: Some(identity),
                    };
                    begin(network, peer, too_many, &*serve, held, &refusals);
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

/// Serves `peer` on `network` the capability it gets: the broken one of a
/// peer over its bound (`too_many`), else what `serve` gives it. A peer
/// `serve` refuses is closed, and logged in `refusals`.
fn begin(
    network: Box<dyn capnp_rpc::VatNetwork<Side>>,
    peer: Peer,
    too_many: Option<capnp::capability::Client>,
    serve: &Serve,
    held: Held,
    refusals: &RefCell<Refusals>,
) {
    let served = match too_many {
        Some(broken) => Ok(broken),
        None => serve(&peer),
    };
    match served {
        Ok(served) => start(network, served, held),
        Err(why) => refusals.borrow_mut().log(peer.addr, &why),
    }
}

/// Who the certificate a TLS peer presented says it is.
fn peer_identity(stream: &sealed::Sealed) -> Result<Identity, String> {
    let cert = stream
        .peer_certificate()
        .ok_or("it presented no certificate")?;
    Identity::of(cert)
}

fn set_nodelay(stream: &TcpStream) {
    if let Err(err) = stream.set_nodelay(true) {
        tracing::warn!("cannot set TCP_NODELAY: {err}");
    }
}

/// The congestion controls a loopback socket asks for instead of a pacing
/// one, in order: the first the kernel allows is used.
#[cfg(target_os = "linux")]
const UNPACED: [&[u8]; 2] = [b"cubic", b"reno"];

/// The name in a `TCP_CONGESTION` value, without the NULs the kernel pads
/// it with.
#[cfg(target_os = "linux")]
fn congestion_name(value: &[u8]) -> &[u8] {
    value.split(|&b| b == 0).next().unwrap_or_default()
}

/// Whether a socket to or on `addr` whose `TCP_CONGESTION` value is
/// `current` should change to one of [`UNPACED`]: only BBR (the one that
/// paces) on a loopback address.
#[cfg(target_os = "linux")]
fn wants_unpaced(addr: IpAddr, current: &[u8]) -> bool {
    addr.is_loopback() && congestion_name(current) == b"bbr"
}

/// A socket to (or listening on) this machine (`127.0.0.0/8`, `::1`) whose
/// congestion control is BBR gets one that does not pace, before it
/// connects (an accepted connection takes its listener's). BBR spaces a
/// flow's packets by its estimate of the path's bandwidth; between two
/// processes of one machine that estimate came out as low as tens of
/// Mbit/s, and a 128 KiB partial result waited milliseconds for the pacing
/// timer (a local cluster at 1% density answers about 10% more queries a
/// second without it). Nothing on loopback can be congested. A connection
/// must start without BBR: one switched after it connected goes on pacing
/// (the kernel keeps the flag BBR set). Every other address keeps the
/// host's choice.
#[cfg(target_os = "linux")]
fn unpaced_on_loopback(socket: &socket2::SockRef<'_>, addr: IpAddr) {
    let Ok(current) = socket.tcp_congestion() else {
        return;
    };
    if !wants_unpaced(addr, &current) {
        return;
    }
    if !UNPACED
        .iter()
        .any(|name| socket.set_tcp_congestion(name).is_ok())
    {
        tracing::debug!("a loopback socket keeps BBR: the kernel allows neither cubic nor reno");
    }
}

/// Only Linux is known to pace TCP by itself (BBR).
#[cfg(not(target_os = "linux"))]
fn unpaced_on_loopback(_: &socket2::SockRef<'_>, _: IpAddr) {}

/// A plain connection's network: the socket's halves, no lock between them.
fn plain(stream: TcpStream, side: Side, sent: Sent) -> Box<dyn capnp_rpc::VatNetwork<Side>> {
    let (reader, writer) = stream.into_split();
    network(reader, writer, side, sent)
}

/// A TLS connection's network; a read or write that fails because the
/// peer refused this end's certificate (TLS 1.3 tells a client so only
/// after its handshake) says so. A peer whose socket ended without a
/// close_notify (stopped or killed: no process of ours sends one) is
/// handed to Cap'n Proto as a lost connection, still an error saying so.
fn encrypted(
    stream: sealed::Sealed,
    side: Side,
    sent: Sent,
) -> Box<dyn capnp_rpc::VatNetwork<Side>> {
    let role = match side {
        Side::Client => End::Client,
        Side::Server => End::Server,
    };
    let (reader, writer) = stream.split(move |err| {
        if is_alert(&err) {
            handshake_error(handshake_failure(&err, role, None))
        } else if err.kind() == std::io::ErrorKind::UnexpectedEof {
            std::io::Error::new(std::io::ErrorKind::ConnectionAborted, err)
        } else {
            err
        }
    });
    network(reader, writer, side, sent)
}

fn network(
    reader: impl AsyncRead + Unpin + 'static,
    writer: impl AsyncWrite + Unpin + 'static,
    side: Side,
    sent: Sent,
) -> Box<dyn capnp_rpc::VatNetwork<Side>> {
    Box::new(vat::TwoParty::new(
        tokio::io::BufReader::new(reader),
        sending(writer, sent),
        side,
        reader_options(),
    ))
}

/// What capnp-rpc writes a connection's messages to: its socket's write
/// half, through the write buffer, counted in `sent`.
fn sending<W: AsyncWrite + Unpin>(writer: W, sent: Sent) -> writer::WriteBuffer<Counted<W>> {
    writer::WriteBuffer::new(
        WRITE_BUFFER,
        Counted {
            inner: writer,
            sent,
        },
    )
}

/// Which end of a TLS connection this process is.
#[derive(Clone, Copy)]
enum End {
    Client,
    Server,
}

/// A failed TLS handshake, in words: what the peer did wrong, or what it
/// said this end did wrong. `ca` is the CA file this end trusts, if known.
fn handshake_failure(err: &std::io::Error, role: End, ca: Option<&std::path::Path>) -> String {
    use rustls::{AlertDescription as Alert, CertificateError, Error as TlsError};
    let peer = match role {
        End::Client => "the server",
        End::Server => "the client",
    };
    let ca = match ca {
        Some(ca) => format!("the CA in {}", ca.display()),
        None => "the cluster's CA".to_owned(),
    };
    let Some(cause) = err.get_ref().and_then(|e| e.downcast_ref::<TlsError>()) else {
        return match err.kind() {
            std::io::ErrorKind::UnexpectedEof => format!(
                "{HANDSHAKE_FAILED}: {peer} closed the connection (does it run without --tls?)"
            ),
            _ => format!("{HANDSHAKE_FAILED}: {}", describe_io(err)),
        };
    };
    let why = match cause {
        TlsError::AlertReceived(Alert::CertificateRequired) => {
            format!("{peer} requires a certificate signed by its CA: pass --tls DIR")
        }
        TlsError::AlertReceived(
            Alert::UnknownCA
            | Alert::BadCertificate
            | Alert::CertificateUnknown
            | Alert::DecryptError
            | Alert::AccessDenied,
        ) => format!("{peer} refused this certificate: it is not signed by {peer}'s CA"),
        TlsError::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => format!("{peer}'s certificate is not signed by {ca}"),
        TlsError::InvalidCertificate(other) => {
            format!("{peer}'s certificate is not valid ({other:?})")
        }
        TlsError::NoCertificatesPresented => {
            format!("{peer} presented no certificate (it needs --tls DIR)")
        }
        TlsError::InvalidMessage(_) | TlsError::InappropriateMessage { .. } => {
            format!("{peer} does not speak TLS (does it run without --tls?)")
        }
        other => other.to_string(),
    };
    format!("{HANDSHAKE_FAILED}: {why}")
}

/// How a call that timed out is reported: `no answer within 5.0 s`.
pub const NO_ANSWER: &str = "no answer within";

/// How the text of every failed TLS handshake starts.
pub const HANDSHAKE_FAILED: &str = "the TLS handshake failed";

/// Whether `err` is a failed TLS handshake (its text says what went wrong).
pub fn is_handshake_failure(err: &std::io::Error) -> bool {
    err.get_ref()
        .is_some_and(|e| e.downcast_ref::<HandshakeFailed>().is_some())
}

/// The text of a failed TLS handshake, inside an `io::Error` whose kind
/// Cap'n Proto reads as a lost connection.
#[derive(Debug)]
struct HandshakeFailed(String);

impl fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HandshakeFailed {}

fn handshake_error(text: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, HandshakeFailed(text))
}

fn is_alert(err: &std::io::Error) -> bool {
    err.get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::AlertReceived(_)))
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

/// Serves `bootstrap` on an accepted connection until it ends; the peer
/// holds it (`held`) until then.
fn start(
    network: Box<dyn capnp_rpc::VatNetwork<Side>>,
    bootstrap: capnp::capability::Client,
    held: Held,
) {
    let system = RpcSystem::new(network, Some(bootstrap));
    tokio::task::spawn_local(async move {
        if let Err(err) = system.await {
            tracing::debug!("connection ended: {err}");
        }
        drop(held);
    });
}

/// A connection to a server and its bootstrap capability; dropping it
/// closes the connection, and a call still under way on it is then never
/// answered: hold the connection (not only its client) until each call
/// ends.
pub struct Connection<C> {
    /// The server's bootstrap capability.
    pub client: C,
    task: JoinHandle<()>,
    closed: Rc<Cell<bool>>,
}

impl<C> Connection<C> {
    /// Whether the peer closed the connection (a restarted or killed server).
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }
}

impl<C> Drop for Connection<C> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects to `addr` (over TLS with `tls`, to a server whose certificate
/// names the role `server`) and bootstraps its capability; what the
/// connection sends is counted in `sent`. A failed TLS handshake, or a
/// server of another role, is an error [`is_handshake_failure`] recognises.
pub async fn connect<C: FromClientHook>(
    addr: &str,
    sent: Sent,
    tls: Option<&Tls>,
    server: Role,
) -> std::io::Result<Connection<C>> {
    let stream = open(addr).await?;
    set_nodelay(&stream);
    let network = match tls {
        None => plain(stream, Side::Client, sent),
        Some(tls) => {
            let handshake = sealed::connect(tls.client(), Tls::server_name(), stream);
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => {
                    let why = handshake_failure(&err, End::Client, Some(tls.ca()));
                    return Err(handshake_error(why));
                }
                Err(_) => {
                    return Err(handshake_error(format!(
                        "{HANDSHAKE_FAILED}: no answer within {} (does the server run \
                         without --tls?)",
                        seconds(HANDSHAKE_TIMEOUT)
                    )));
                }
            };
            match peer_identity(&stream) {
                Ok(identity) if identity.role == server => {}
                Ok(identity) => {
                    return Err(handshake_error(format!(
                        "{HANDSHAKE_FAILED}: the server at {addr} presented {identity}, \
                         not a {server}'s"
                    )));
                }
                Err(why) => {
                    return Err(handshake_error(format!(
                        "{HANDSHAKE_FAILED}: the server at {addr}: {why}"
                    )));
                }
            }
            encrypted(stream, Side::Client, sent)
        }
    };
    let mut system = RpcSystem::new(network, None);
    let client = system.bootstrap(Side::Server);
    let closed = Rc::new(Cell::new(false));
    Ok(Connection {
        client,
        task: spawn_system(system, closed.clone()),
        closed,
    })
}

/// Open connections to slaves, by address; one per process (per runtime).
/// Over TLS, a server whose certificate is not a slave's is refused.
///
/// A connection is evicted (and closed) when a call on it fails or times
/// out, so the next call reconnects.
pub struct Pool {
    connections: RefCell<HashMap<String, Rc<Connection<slave::Client>>>>,
    sent: Sent,
    tls: Option<Tls>,
}

impl Pool {
    /// A pool whose connections count what they send in `sent`, over TLS with `tls`.
    pub fn new(sent: Sent, tls: Option<Tls>) -> Pool {
        Pool {
            connections: RefCell::default(),
            sent,
            tls,
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
        let fresh =
            Rc::new(connect(addr, self.sent.clone(), self.tls.as_ref(), Role::Slave).await?);
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
    pub async fn call<T, F, Fut>(&self, addr: &str, timeout: Duration, call: F) -> Result<T, String>
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
            Err(_) => Err(format!("{NO_ANSWER} {}", seconds(timeout))),
        };
        if result.is_err() {
            self.evict(addr, used.take().as_ref());
        }
        result
    }
}

/// An I/O error for a one-line message: `connection refused`, without the OS error number.
pub fn describe_io(err: &std::io::Error) -> String {
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
pub fn seconds(duration: Duration) -> String {
    if duration >= Duration::from_secs(1) {
        format!("{:.1} s", duration.as_secs_f64())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use futures::AsyncWriteExt;

    use super::*;

    /// A socket's write half that takes everything and counts its calls.
    #[derive(Default, Clone)]
    struct Socket(Rc<RefCell<Written>>);

    #[derive(Default)]
    struct Written {
        bytes: Vec<u8>,
        calls: usize,
    }

    impl AsyncWrite for Socket {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            slices: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let mut written = self.0.borrow_mut();
            written.calls += 1;
            for slice in slices {
                written.bytes.extend_from_slice(slice);
            }
            Poll::Ready(Ok(slices.iter().map(|s| s.len()).sum()))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn a_message_with_a_partial_result_leaves_in_one_send_and_is_counted() {
        let table = vec![1u8; 16];
        let root = vec![2u8; 200];
        let data = vec![3u8; 128 << 10];
        let sent = Sent::default();
        let socket = Socket::default();
        futures::executor::block_on(async {
            let mut writer = sending(socket.clone(), sent.clone());
            for piece in [&table, &root, &data] {
                writer.write_all(piece).await.unwrap();
            }
            writer.flush().await.unwrap();
        });
        let written = socket.0.borrow();
        assert_eq!(written.calls, 1, "one send wakes the peer once");
        assert_eq!(written.bytes, [table, root, data].concat());
        assert_eq!(sent.bytes(), written.bytes.len() as u64);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_bbr_on_a_loopback_link_is_changed() {
        let loopback = [
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from([127, 3, 2, 1]),
            "::1".parse().unwrap(),
        ];
        for peer in loopback {
            assert!(wants_unpaced(peer, b"bbr"), "{peer}");
            assert!(
                wants_unpaced(peer, b"bbr\0\0\0\0\0\0\0\0\0\0\0\0\0"),
                "{peer}: as the kernel pads it"
            );
            assert!(!wants_unpaced(peer, b"cubic\0\0\0"), "{peer}");
            assert!(!wants_unpaced(peer, b"bbr2"), "{peer}");
        }
        for peer in [
            IpAddr::from([10, 1, 2, 3]),
            IpAddr::from([192, 168, 0, 9]),
            "fe80::1".parse().unwrap(),
        ] {
            assert!(
                !wants_unpaced(peer, b"bbr"),
                "{peer}: the network's hosts keep the host's choice"
            );
        }
    }

    /// The congestion control `stream` runs, by name.
    #[cfg(target_os = "linux")]
    fn congestion(stream: &TcpStream) -> String {
        let now = socket2::SockRef::from(stream).tcp_congestion().unwrap();
        String::from_utf8_lossy(congestion_name(&now)).into_owned()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_loopback_connection_starts_unpaced_at_both_ends() {
        let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .unwrap_or_default();
        let default = default.trim();
        block_on_local(async {
            let listener = bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let client = open(&addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            for (end, stream) in [("client", &client), ("server", &server)] {
                let runs = congestion(stream);
                assert_ne!(runs, "bbr", "the {end} end of a loopback connection paces");
                if default != "bbr" {
                    assert_eq!(
                        runs, default,
                        "the {end} end keeps a host default that does not pace"
                    );
                }
            }
        })
        .unwrap();
        if default != "bbr" {
            eprintln!("this host does not run BBR by default: only checked that nothing changed");
        }
    }

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
            let addr = listener.local_addr().unwrap().to_string();
            let served = capnp_rpc::new_broken_cap(capnp::Error::failed("served".to_owned()));
            let serve = Rc::new(move |_: &Peer| Ok(served.clone()));
            tokio::task::spawn_local(accept_at_most(listener, serve, Sent::default(), None, 2));
            let connect = || connect::<slave::Client>(&addr, Sent::default(), None, Role::Slave);
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
