//! A TLS connection: rustls runs the handshake over its unbuffered API,
//! then [`record`](super::record) seals and opens the records in this
//! module's buffers. Sealed records are read from the socket straight into
//! one buffer allocated once, compacted only when its tail has no room for
//! a whole record, and opened there; a write's records are sealed into
//! another buffer that the socket writes from.
//!
//! [`handshake`] runs the whole handshake before the connection is used;
//! [`Sealed::split`] then gives the read and write halves capnp-rpc drives,
//! which share the connection (one thread, so an `Rc<RefCell>`).

use std::cell::RefCell;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{AlertDescription, ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::record::{self, DATA_MAX, Kernel, OVERHEAD, Opened, RECORD_MAX, Records, SEAL_ROOM};

/// Bytes of sealed records the incoming buffer holds: a read takes up to
/// this much from the socket at once.
const INCOMING: usize = 256 << 10;

/// Bytes of data one write seals at most, and bytes of sealed records
/// held before a write waits for the socket to take some.
const SEND_LIMIT: usize = 320 << 10;

/// One end of a TLS connection while rustls runs its handshake.
enum Session {
    /// This end dialled.
    Client(Box<UnbufferedClientConnection>),
    /// This end accepted.
    Server(Box<UnbufferedServerConnection>),
}

impl Session {
    fn is_handshaking(&self) -> bool {
        match self {
            Session::Client(c) => c.is_handshaking(),
            Session::Server(s) => s.is_handshaking(),
        }
    }

    /// Whether rustls has records to send (an alert, handshake records).
    fn wants_write(&self) -> bool {
        match self {
            Session::Client(c) => c.wants_write(),
            Session::Server(s) => s.wants_write(),
        }
    }

    /// Hands rustls `records` (received, not yet used) and moves the
    /// connection on by one state: see [`step`].
    fn advance(
        &mut self,
        records: &mut [u8],
        plain: &mut Window,
        out: &mut Window,
    ) -> (usize, io::Result<Step>) {
        match self {
            Session::Client(c) => step(c.process_tls_records(records), plain, out),
            Session::Server(s) => step(s.process_tls_records(records), plain, out),
        }
    }

    /// The record layer that carries the connection on once the handshake
    /// is done: rustls hands over its keys and keeps its key schedule.
    fn into_records(self) -> Result<Records, rustls::Error> {
        match self {
            Session::Client(c) => {
                let (secrets, kernel) = c.dangerous_into_kernel_connection()?;
                Records::new(secrets, Kernel::Client(kernel))
            }
            Session::Server(s) => {
                let (secrets, kernel) = s.dangerous_into_kernel_connection()?;
                Records::new(secrets, Kernel::Server(kernel))
            }
        }
    }
}

/// Bytes at `start..end` of `bytes` wait to be used; the rest is room.
#[derive(Default)]
struct Window {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
}

impl Window {
    fn pending(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Counts `n` pending bytes as used.
    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Moves the pending bytes to the front.
    fn compact(&mut self) {
        if self.start > 0 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// At least `n` bytes of room after the pending ones, moving them to
    /// the front or growing the buffer when needed.
    fn room(&mut self, n: usize) -> &mut [u8] {
        if self.bytes.len() - self.end < n {
            self.compact();
        }
        if self.bytes.len() - self.end < n {
            self.bytes.resize(self.end + n, 0);
        }
        &mut self.bytes[self.end..]
    }

    /// Copies as much of the pending bytes as fits into `dest`.
    fn take_into(&mut self, dest: &mut ReadBuf<'_>) {
        let n = dest.remaining().min(self.end - self.start);
        dest.put_slice(&self.bytes[self.start..self.start + n]);
        self.consume(n);
    }

    /// Appends `bytes`.
    fn push(&mut self, bytes: &[u8]) {
        self.room(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }
}

/// Where one call into rustls left a handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// It did something (opened data, encoded handshake records): ask again.
    Again,
    /// It has nothing more to do with what it holds: what it encoded goes
    /// out, then it is done or needs more records from the peer.
    Waiting,
    /// The peer sent close_notify.
    Closed,
}

/// Moves a handshake on by one state: encodes handshake records into
/// `out`, opens into `plain` the data a peer sent right after its last
/// handshake message. Returns the bytes of records used up and where the
/// handshake is.
fn step<D>(
    status: UnbufferedStatus<'_, '_, D>,
    plain: &mut Window,
    out: &mut Window,
) -> (usize, io::Result<Step>) {
    let mut discard = status.discard;
    let state = match status.state {
        Ok(state) => state,
        Err(err) => return (discard, Err(invalid(err))),
    };
    let step = match state {
        ConnectionState::ReadTraffic(mut traffic) => {
            while let Some(record) = traffic.next_record() {
                match record {
                    Ok(record) => {
                        discard += record.discard;
                        plain.push(record.payload);
                    }
                    Err(err) => return (discard, Err(invalid(err))),
                }
            }
            Ok(Step::Again)
        }
        ConnectionState::EncodeTlsData(mut encode) => loop {
            match encode.encode(out.room(0)) {
                Ok(n) => {
                    out.end += n;
                    break Ok(Step::Again);
                }
                Err(EncodeError::InsufficientSize(size)) => {
                    out.room(size.required_size);
                }
                Err(err) => break Err(io::Error::other(err)),
            }
        },
        // What is encoded leaves, in order, from `out`: rustls need not wait.
        ConnectionState::TransmitTlsData(transmit) => {
            transmit.done();
            Ok(Step::Again)
        }
        ConnectionState::BlockedHandshake | ConnectionState::WriteTraffic(_) => Ok(Step::Waiting),
        ConnectionState::PeerClosed | ConnectionState::Closed => Ok(Step::Closed),
        other => Err(invalid(format!("unexpected TLS state {other:?}"))),
    };
    (discard, step)
}

/// A connection's socket and its buffers of sealed records.
struct Link {
    socket: TcpStream,
    /// Sealed records read, not yet opened.
    incoming: Window,
    /// Sealed records not yet written to the socket.
    out: Window,
}

impl Link {
    fn new(socket: TcpStream) -> Link {
        Link {
            socket,
            incoming: Window {
                bytes: vec![0; INCOMING],
                ..Window::default()
            },
            out: Window::default(),
        }
    }

    /// Reads what the socket has into the incoming buffer, which never
    /// grows; `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.incoming.bytes.len() - self.incoming.end < RECORD_MAX {
            self.incoming.compact();
            if self.incoming.bytes.len() - self.incoming.end < RECORD_MAX {
                return Poll::Ready(Err(invalid(format!(
                    "the peer's TLS records do not fit in {} KiB (a handshake message in too \
                     many pieces)",
                    INCOMING >> 10
                ))));
            }
        }
        let mut buf = ReadBuf::new(&mut self.incoming.bytes[self.incoming.end..]);
        ready!(Pin::new(&mut self.socket).poll_read(cx, &mut buf))?;
        let n = buf.filled().len();
        self.incoming.end += n;
        Poll::Ready(Ok(n))
    }

    /// Reads what the socket has now, without waiting, as far as the
    /// incoming buffer has room.
    fn try_fill(&mut self) {
        self.incoming.compact();
        while self.incoming.end < self.incoming.bytes.len() {
            match self
                .socket
                .try_read(&mut self.incoming.bytes[self.incoming.end..])
            {
                Ok(n @ 1..) => self.incoming.end += n,
                _ => break,
            }
        }
    }

    /// Writes every sealed record held to the socket.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.socket).poll_write(cx, self.out.pending()))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.consume(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Writes what sealed records the socket takes now, without waiting.
    /// Errors are left for the next write to find.
    fn try_drain(&mut self) {
        while !self.out.is_empty() {
            match self.socket.try_write(self.out.pending()) {
                Ok(n @ 1..) => self.out.consume(n),
                _ => break,
            }
        }
    }
}

/// A connection while rustls runs its handshake.
struct Handshake {
    session: Session,
    link: Link,
    /// Data the peer sent right after its handshake, opened by rustls.
    plain: Window,
}

impl Handshake {
    /// Moves the handshake on by one state. The error is rustls's (inside
    /// the `io::Error`); the peer is sent the alert rustls chose for it.
    fn process(&mut self) -> io::Result<Step> {
        let Handshake {
            session,
            link,
            plain,
        } = self;
        let records = &mut link.incoming.bytes[link.incoming.start..link.incoming.end];
        let (discard, step) = session.advance(records, plain, &mut link.out);
        link.incoming.consume(discard);
        if step.is_err() {
            self.send_alert();
        }
        step
    }

    /// After an error, encodes the alert rustls queued for the peer and
    /// tries to send it without waiting. rustls is asked only while it has
    /// records to send, which it hands out before it looks at any it
    /// received: those that failed would fail again.
    fn send_alert(&mut self) {
        let Handshake {
            session,
            link,
            plain,
        } = self;
        for _ in 0..4 {
            if !session.wants_write() {
                break;
            }
            let records = &mut link.incoming.bytes[link.incoming.start..link.incoming.end];
            let (discard, _) = session.advance(records, plain, &mut link.out);
            link.incoming.consume(discard);
        }
        link.try_drain();
    }

    /// Writes every handshake record held; a write that fails because the
    /// peer ended the handshake returns the alert it sent first.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(self.link.poll_drain(cx)) {
            Err(err) => {
                self.link.try_fill();
                for _ in 0..8 {
                    match self.process() {
                        Ok(Step::Again) => {}
                        Ok(_) => break,
                        Err(alert) => return Poll::Ready(Err(alert)),
                    }
                }
                Poll::Ready(Err(err))
            }
            done => Poll::Ready(done),
        }
    }

    /// The connection, its handshake done, carried on by its record layer.
    fn into_sealed(self) -> io::Result<Sealed> {
        let peer = match &self.session {
            Session::Client(c) => c.peer_certificates(),
            Session::Server(s) => s.peer_certificates(),
        }
        .and_then(|chain| chain.first().cloned());
        Ok(Sealed {
            peer,
            records: self.session.into_records().map_err(invalid)?,
            link: self.link,
            plain: self.plain,
            peer_closed: false,
            closing: false,
            failed: None,
        })
    }
}

/// Runs `handshake` to its end, sending the peer rustls's alert when it
/// fails.
async fn handshake(mut handshake: Handshake) -> io::Result<Sealed> {
    loop {
        match handshake.process()? {
            Step::Again => {}
            Step::Waiting => {
                poll_fn(|cx| handshake.poll_drain(cx)).await?;
                if !handshake.session.is_handshaking() {
                    return handshake.into_sealed();
                }
                if poll_fn(|cx| handshake.link.poll_fill(cx)).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
            Step::Closed => return Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

/// A TLS connection whose handshake is done.
pub(super) struct Sealed {
    /// The peer's certificate.
    peer: Option<CertificateDer<'static>>,
    records: Records,
    link: Link,
    /// Data opened, not yet read.
    plain: Window,
    /// The peer sent close_notify, or closed its socket.
    peer_closed: bool,
    /// This end sealed its close_notify.
    closing: bool,
    /// What failed, once the records or the buffers did: nothing more is
    /// opened or sealed after it.
    failed: Option<Failure>,
}

/// The first error of a connection, kept to fail every later call alike.
enum Failure {
    /// A TLS error: returned inside each `io::Error`, so that a caller can
    /// tell an alert from the peer.
    Tls(rustls::Error),
    /// Any other.
    Other(io::ErrorKind, String),
}

impl Failure {
    fn error(&self) -> io::Error {
        match self {
            Failure::Tls(err) => invalid(err.clone()),
            Failure::Other(kind, text) => io::Error::new(*kind, text.clone()),
        }
    }
}

impl Sealed {
    /// The certificate the peer presented (both ends present one).
    pub(super) fn peer_certificate(&self) -> Option<&CertificateDer<'static>> {
        self.peer.as_ref()
    }

    /// Fails the connection with `err`: the peer is sent the alert that
    /// says why, and every later call fails the same way.
    fn fail(&mut self, err: rustls::Error) -> io::Error {
        if let Some(alert) = record::alert_for(&err)
            && let Ok(n) = self
                .records
                .seal_alert(alert, self.link.out.room(OVERHEAD + 2))
        {
            self.link.out.end += n;
            self.link.try_drain();
        }
        let failure = Failure::Tls(err);
        let err = failure.error();
        self.failed = Some(failure);
        err
    }

    /// Opens the next whole record received, if one has arrived: its data
    /// goes into `dest` as far as there is room, the rest into `plain`.
    /// False if no whole record has arrived.
    fn open_next(&mut self, dest: Option<&mut ReadBuf<'_>>) -> io::Result<bool> {
        if let Some(failed) = &self.failed {
            return Err(failed.error());
        }
        let incoming = &mut self.link.incoming;
        let len = match record::record_len(incoming.pending()) {
            Ok(Some(len)) => len,
            Ok(None) => return Ok(false),
            Err(err) => return Err(self.fail(err)),
        };
        let record = &mut incoming.bytes[incoming.start..incoming.start + len];
        match self.records.open(record) {
            Ok(Opened::Data(range)) => {
                let mut data = &record[range];
                if let Some(dest) = dest {
                    let n = dest.remaining().min(data.len());
                    dest.put_slice(&data[..n]);
                    data = &data[n..];
                }
                self.plain.push(data);
            }
            Ok(Opened::Closed) => self.peer_closed = true,
            Ok(Opened::Control) => {}
            Err(err) => return Err(self.fail(err)),
        }
        self.link.incoming.consume(len);
        Ok(true)
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        loop {
            if !self.plain.is_empty() {
                self.plain.take_into(buf);
                return Poll::Ready(Ok(()));
            }
            if self.peer_closed || buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
            if self.open_next(Some(buf))? {
                continue;
            }
            match self.link.poll_fill(cx) {
                // Every whole record is opened: the rest is one cut short.
                Poll::Ready(Ok(0)) if !self.link.incoming.is_empty() => {
                    let err = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed its connection in the middle of a TLS record",
                    );
                    self.failed = Some(Failure::Other(err.kind(), err.to_string()));
                    return Poll::Ready(Err(err));
                }
                Poll::Ready(Ok(0)) => self.peer_closed = true,
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(failed) = &self.failed {
            return Poll::Ready(Err(failed.error()));
        }
        if self.closing {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if self.link.out.pending().len() >= SEND_LIMIT {
            if let Poll::Ready(Err(err)) = self.poll_drain(cx) {
                return Poll::Ready(Err(err));
            }
            if self.link.out.pending().len() >= SEND_LIMIT {
                return Poll::Pending;
            }
        }
        let total = data
            .iter()
            .map(|slice| slice.len())
            .sum::<usize>()
            .min(SEND_LIMIT);
        let mut sealed = 0;
        while sealed < total {
            let len = (total - sealed).min(DATA_MAX);
            let room = self.link.out.room(SEAL_ROOM);
            match self
                .records
                .seal_data(room, len, |dest| gather(data, sealed, dest))
            {
                Ok(n) => self.link.out.end += n,
                Err(err) => return Poll::Ready(Err(self.fail(err))),
            }
            sealed += len;
        }
        Poll::Ready(Ok(sealed))
    }

    /// Writes every sealed record held to the socket; a write that fails
    /// returns the alert the peer sent before it closed, if it did.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(self.link.poll_drain(cx)) {
            Err(err) => Poll::Ready(Err(self.explain(err))),
            done => Poll::Ready(done),
        }
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.closing {
            if let Some(failed) = &self.failed {
                return Poll::Ready(Err(failed.error()));
            }
            let room = self.link.out.room(OVERHEAD + 2);
            match self.records.seal_alert(AlertDescription::CloseNotify, room) {
                Ok(n) => self.link.out.end += n,
                Err(err) => return Poll::Ready(Err(self.fail(err))),
            }
            self.closing = true;
        }
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.link.socket).poll_shutdown(cx)
    }

    /// The error to report for `err`, a socket's failed write: the peer
    /// may have closed the connection after an alert saying why (a server
    /// refusing a TLS 1.3 client's certificate does so after the client's
    /// handshake ended), and then the alert is the error.
    fn explain(&mut self, err: io::Error) -> io::Error {
        if self.failed.is_none() {
            self.link.try_fill();
            while let Ok(true) = self.open_next(None) {}
        }
        match &self.failed {
            Some(failed) => failed.error(),
            None => err,
        }
    }

    /// Splits the connection into the halves capnp-rpc reads and writes;
    /// every error either returns passes through `explain` first.
    pub(super) fn split(
        self,
        explain: impl Fn(io::Error) -> io::Error + 'static,
    ) -> (ReadHalf, WriteHalf) {
        let shared = Rc::new(Shared {
            sealed: RefCell::new(self),
            explain: Box::new(explain),
        });
        (ReadHalf(shared.clone()), WriteHalf(shared))
    }
}

/// Copies into `dest` the bytes of `data`, taken as one stream, from
/// `skip` on.
fn gather(data: &[IoSlice<'_>], mut skip: usize, mut dest: &mut [u8]) {
    for slice in data {
        if dest.is_empty() {
            break;
        }
        if skip >= slice.len() {
            skip -= slice.len();
            continue;
        }
        let piece = &slice[skip..];
        skip = 0;
        let n = piece.len().min(dest.len());
        dest[..n].copy_from_slice(&piece[..n]);
        dest = &mut dest[n..];
    }
}

/// The server's end of a connection accepted on `socket`, once its
/// handshake is done. A failed handshake's error holds rustls's, and the
/// peer was sent the alert rustls chose.
pub(super) async fn accept(config: Arc<ServerConfig>, socket: TcpStream) -> io::Result<Sealed> {
    let session = UnbufferedServerConnection::new(config).map_err(invalid)?;
    handshake(Handshake {
        session: Session::Server(Box::new(session)),
        link: Link::new(socket),
        plain: Window::default(),
    })
    .await
}

/// The client's end of a connection on `socket` to a server whose
/// certificate names `name`, once its handshake is done; errors as
/// [`accept`]'s.
pub(super) async fn connect(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    socket: TcpStream,
) -> io::Result<Sealed> {
    let session = UnbufferedClientConnection::new(config, name).map_err(invalid)?;
    handshake(Handshake {
        session: Session::Client(Box::new(session)),
        link: Link::new(socket),
        plain: Window::default(),
    })
    .await
}

/// A TLS error as an I/O error that holds it.
fn invalid(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err)
}

/// What both halves of a [`Sealed`] connection hold.
struct Shared {
    sealed: RefCell<Sealed>,
    /// The caller's words for an error.
    explain: Box<dyn Fn(io::Error) -> io::Error>,
}

impl Shared {
    /// Calls `call` on the connection, its error explained.
    fn with<T>(
        &self,
        call: impl FnOnce(&mut Sealed) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match call(&mut self.sealed.borrow_mut()) {
            Poll::Ready(Err(err)) => Poll::Ready(Err((self.explain)(err))),
            polled => polled,
        }
    }
}

/// The read half of a [`Sealed`] connection.
pub(super) struct ReadHalf(Rc<Shared>);

/// The write half of a [`Sealed`] connection.
pub(super) struct WriteHalf(Rc<Shared>);

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.with(|sealed| sealed.poll_read(cx, buf))
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0
            .with(|sealed| sealed.poll_write(cx, &[IoSlice::new(buf)]))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.0.with(|sealed| sealed.poll_write(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.with(|sealed| sealed.poll_drain(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.with(|sealed| sealed.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::tls::{self, Tls};
    use bitfold_certs::cluster_set;

    /// Two loopback sockets connected to each other: (dialled, accepted).
    async fn sockets() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (dialled, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (dialled.unwrap(), accepted.unwrap().0)
    }

    /// Configurations: two processes of one cluster; a process of another
    /// cluster; a process that trusts the first cluster's CA but holds a
    /// certificate of the other.
    fn configurations() -> [Tls; 4] {
        let dir = tempfile::tempdir().unwrap();
        cluster_set(&dir.path().join("ours"), &["a", "b"]).unwrap();
        cluster_set(&dir.path().join("theirs"), &["c"]).unwrap();
        let load = |path: &str| Tls::load(&dir.path().join(path)).unwrap();
        // Trusts our CA with their certificate (and no revocation list:
        // theirs is not our CA's, and a list from another CA fails closed).
        let mixed = tls::Files {
            ca: dir.path().join("ours/ca/ca.pem"),
            crl: None,
            ..tls::Files::in_folder(&dir.path().join("theirs/c"))
        };
        [
            load("ours/a"),
            load("ours/b"),
            load("theirs/c"),
            Tls::load_files(&mixed).unwrap(),
        ]
    }

    /// Both ends of a connection from `client` to `server`, once their
    /// handshakes end.
    async fn handshakes(client: &Tls, server: &Tls) -> (io::Result<Sealed>, io::Result<Sealed>) {
        let (dialled, accepted) = sockets().await;
        tokio::join!(
            connect(client.client(), Tls::server_name(), dialled),
            accept(server.server(), accepted)
        )
    }

    /// Writes `bytes` in pieces of `pieces` bytes (in turn), each offered
    /// as two slices of one vectored write, then flushes.
    async fn send(half: &mut WriteHalf, mut bytes: &[u8], pieces: &[usize]) {
        for &piece in pieces.iter().cycle() {
            if bytes.is_empty() {
                break;
            }
            let (piece, rest) = bytes.split_at(piece.clamp(1, bytes.len()));
            let (a, b) = piece.split_at(piece.len() / 2);
            let n = half
                .write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
                .await
                .unwrap();
            half.write_all(&piece[n..]).await.unwrap();
            bytes = rest;
        }
        half.flush().await.unwrap();
    }

    /// Reads `len` bytes into buffers of `sizes` bytes (in turn).
    async fn receive(half: &mut ReadHalf, len: usize, sizes: &[usize]) -> Vec<u8> {
        let mut got = Vec::with_capacity(len);
        for &size in sizes.iter().cycle() {
            if got.len() == len {
                break;
            }
            let mut buf = vec![0; size.clamp(1, len - got.len())];
            let n = half.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "the stream ended after {} of {len} bytes", got.len());
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Whatever the sizes of writes and reads, on both ends at once,
        /// each end reads exactly the bytes the other wrote: across
        /// records, across the send limit, across compactions of the
        /// incoming buffer.
        #[test]
        fn each_end_reads_what_the_other_wrote(
            seed: u64,
            lens in (0usize..1_500_000, 0usize..1_500_000),
            pieces in prop::collection::vec(prop_oneof![1usize..100, 1usize..70_000, 300_000usize..500_000], 1..6),
            sizes in prop::collection::vec(prop_oneof![1usize..10, 1usize..20_000, 100_000usize..400_000], 1..6),
        ) {
            let [a, b, ..] = configurations();
            let bytes = |len: usize, salt: u64| -> Vec<u8> {
                (0..len as u64).map(|i| (i.wrapping_mul(seed | 1) ^ salt).to_le_bytes()[3]).collect()
            };
            let (up, down) = (bytes(lens.0, 1), bytes(lens.1, 2));
            let (got_up, got_down) = crate::net::block_on_local(async {
                let (client, server) = handshakes(&a, &b).await;
                let (mut client_read, mut client_write) = client.unwrap().split(|err| err);
                let (mut server_read, mut server_write) = server.unwrap().split(|err| err);
                tokio::join!(
                    send(&mut client_write, &up, &pieces),
                    send(&mut server_write, &down, &pieces),
                    async {
                        let got_up = receive(&mut server_read, up.len(), &sizes).await;
                        let got_down = receive(&mut client_read, down.len(), &sizes).await;
                        (got_up, got_down)
                    },
                ).2
            })
            .unwrap();
            prop_assert!(got_up == up, "the server read other bytes than the client wrote");
            prop_assert!(got_down == down, "the client read other bytes than the server wrote");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever a peer sends before it closes (records of any type,
        /// version and length, in any number of pieces), the server's
        /// handshake ends with an error: no panic, no hang.
        #[test]
        fn any_bytes_end_a_servers_handshake_with_an_error(bytes in unsealed_bytes()) {
            let [_, b, ..] = configurations();
            let ended = crate::net::block_on_local(async {
                let (dialled, accepted) = sockets().await;
                let peer = send_and_close(dialled, bytes);
                let server = tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    accept(b.server(), accepted),
                );
                tokio::join!(server, peer).0
            })
            .unwrap();
            prop_assert!(matches!(ended, Ok(Err(_))), "the handshake did not fail: {:?}", ended.map(|r| r.map(|_| ())));
        }
    }

    /// Sends `bytes` on `socket` as they are, closes its sending side and
    /// reads until the other end closes. The other end may close first:
    /// what it refuses to read is fine.
    async fn send_and_close(mut socket: TcpStream, bytes: Vec<u8>) {
        let _ = socket.write_all(&bytes).await;
        let _ = socket.shutdown().await;
        let _ = socket.read_to_end(&mut Vec::new()).await;
    }

    /// Reads `half` until its stream ends or fails: what was read, and
    /// how the stream ended.
    async fn read_to_the_end(half: &mut ReadHalf) -> (Vec<u8>, io::Result<()>) {
        let mut read = Vec::new();
        let mut buf = vec![0; 64 << 10];
        loop {
            match half.read(&mut buf).await {
                Ok(0) => return (read, Ok(())),
                Ok(n) => read.extend_from_slice(&buf[..n]),
                Err(err) => return (read, Err(err)),
            }
        }
    }

    /// Records of any type, version and length (filled from their last
    /// number), then any bytes or a record cut short: what a peer may send
    /// that no TLS stack sealed.
    fn unsealed_bytes() -> impl Strategy<Value = Vec<u8>> {
        let records = prop::collection::vec(
            (
                prop_oneof![Just(22u8), Just(21u8), Just(23u8), Just(20u8), any::<u8>()],
                prop_oneof![Just(0x0301u16), Just(0x0303u16), any::<u16>()],
                prop_oneof![
                    0usize..64,
                    0usize..20_000,
                    Just(16_640usize),
                    Just(65_535usize)
                ],
                any::<u8>(),
            ),
            0..6,
        );
        let cut = (1usize..105).prop_map(|n| {
            let mut record = vec![23, 3, 3, 0, 100];
            record.extend(0..100);
            record.truncate(n);
            record
        });
        let tail = prop_oneof![prop::collection::vec(any::<u8>(), 0..300), cut];
        (records, tail).prop_map(|(records, tail)| {
            let mut bytes = Vec::new();
            for (kind, version, len, fill) in records {
                bytes.push(kind);
                bytes.extend_from_slice(&version.to_be_bytes());
                bytes.extend_from_slice(&(len as u16).to_be_bytes());
                bytes.extend((0..len).map(|i| fill.wrapping_add(i as u8)));
            }
            bytes.extend_from_slice(&tail);
            bytes
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Once a connection is up, whatever bytes a peer's socket sends
        /// after what its TLS end sealed, the other end reads exactly what
        /// was sealed and then an error: nothing unsealed is ever read as
        /// data, nothing panics or hangs. Only a close with nothing after
        /// the last record reads as the stream's end.
        #[test]
        fn after_the_handshake_only_sealed_bytes_are_read(
            len in 0usize..100_000,
            unsealed in unsealed_bytes(),
        ) {
            let [a, b, ..] = configurations();
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let sent = unsealed.len();
            let (read, ended) = crate::net::block_on_local(async {
                let (client, server) = handshakes(&a, &b).await;
                let (client_read, mut client_write) = client.unwrap().split(|err| err);
                let (mut server_read, server_write) = server.unwrap().split(|err| err);
                client_write.write_all(&data).await.unwrap();
                client_write.flush().await.unwrap();
                drop(client_read);
                let shared = Rc::into_inner(client_write.0).expect("both halves are here");
                let socket = shared.sealed.into_inner().link.socket;
                let peer = send_and_close(socket, unsealed);
                let server = async move {
                    let (read, ended) = read_to_the_end(&mut server_read).await;
                    // Closing lets the peer's last read end.
                    drop((server_read, server_write));
                    (read, ended)
                };
                tokio::time::timeout(std::time::Duration::from_secs(10), async {
                    tokio::join!(server, peer).0
                })
                .await
                .expect("the server's reads end")
            })
            .unwrap();
            prop_assert!(read == data, "read {} bytes, {} sealed", read.len(), data.len());
            if sent == 0 {
                prop_assert!(ended.is_ok(), "{:?}", ended);
            } else {
                prop_assert!(ended.is_err(), "{sent} unsealed bytes read as the stream's end");
            }
        }
    }

    /// What a record may hold inside, sealed by a peer that holds the
    /// keys: data, an alert, handshake messages (a KeyUpdate, a ticket,
    /// cut short or too long), any type, too much.
    fn inner_records() -> impl Strategy<Value = Vec<(u8, Vec<u8>)>> {
        let bytes = |max| prop::collection::vec(any::<u8>(), 0..max);
        let record = prop_oneof![
            4 => bytes(3_000).prop_map(|data| (23u8, data)),
            1 => (any::<u8>(), prop_oneof![Just(0u8), any::<u8>()])
                .prop_map(|(level, description)| (21u8, vec![level, description])),
            1 => bytes(8).prop_map(|content| (21u8, content)),
            1 => (prop_oneof![Just(24u8), Just(4u8), any::<u8>()], 0u32..8, bytes(10))
                .prop_map(|(kind, len, body)| {
                    let mut message = vec![kind];
                    message.extend_from_slice(&len.to_be_bytes()[1..]);
                    message.extend_from_slice(&body);
                    (22u8, message)
                }),
            1 => (any::<u8>(), bytes(100)).prop_map(|(kind, content)| (kind, content)),
            1 => Just((23u8, vec![7; DATA_MAX + 1])),
        ];
        prop::collection::vec(record, 1..6)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever a peer that holds the keys seals, the reader gets the
        /// data of the records before the first that is not data, then the
        /// stream's end (at a close_notify, or after the last record) or an
        /// error (the peer's alert, when it sent one): no panic, no hang.
        #[test]
        fn whatever_a_peer_with_the_keys_seals_is_read_or_refused(records in inner_records()) {
            let [a, b, ..] = configurations();
            let (read, ended) = crate::net::block_on_local(async {
                let (client, server) = handshakes(&a, &b).await;
                let mut client = client.unwrap();
                let mut bytes = Vec::new();
                for (kind, content) in &records {
                    let mut room = vec![0; content.len() + OVERHEAD];
                    let n = client.records.seal_any(*kind, content, &mut room);
                    bytes.extend_from_slice(&room[..n]);
                }
                let peer = send_and_close(client.link.socket, bytes);
                let (mut server_read, server_write) = server.unwrap().split(|err| err);
                let server = async move {
                    let ended = read_to_the_end(&mut server_read).await;
                    drop((server_read, server_write));
                    ended
                };
                tokio::time::timeout(std::time::Duration::from_secs(10), async {
                    tokio::join!(server, peer).0
                })
                .await
                .expect("the server's reads end")
            })
            .unwrap();
            let data = records.iter().take_while(|(kind, content)| *kind == 23 && content.len() <= DATA_MAX);
            let expected: Vec<u8> = data.clone().flat_map(|(_, content)| content.clone()).collect();
            prop_assert!(read == expected, "read {} bytes, expected {}", read.len(), expected.len());
            match records.get(data.count()).map(|(kind, content)| (*kind, &content[..])) {
                None | Some((21, [_, 0])) => prop_assert!(ended.is_ok(), "{:?}", ended),
                Some((21, [_, description])) => {
                    let err = ended.expect_err("an alert is an error");
                    let alert = AlertDescription::from(*description);
                    prop_assert!(
                        matches!(rustls_error(&err), rustls::Error::AlertReceived(got) if *got == alert),
                        "{err}"
                    );
                }
                Some(_) => {}
            }
        }
    }

    #[test]
    fn a_handshake_message_in_too_many_pieces_is_refused() {
        // A client hello announcing 60,000 bytes, sent one byte a record:
        // 360 KB of records before the message is whole.
        let mut message = vec![1, 0, 0xea, 0x60];
        message.resize(4 + 60_000, 0);
        let mut bytes = Vec::new();
        for byte in message {
            bytes.extend_from_slice(&[22, 3, 1, 0, 1, byte]);
        }
        let [_, b, ..] = configurations();
        crate::net::block_on_local(async {
            let (mut dialled, accepted) = sockets().await;
            let peer = async move {
                let _ = dialled.write_all(&bytes).await;
                let _ = dialled.read_to_end(&mut Vec::new()).await;
            };
            let (server, ()) = tokio::join!(accept(b.server(), accepted), peer);
            let err = server.err().expect("the server refuses it");
            assert!(err.to_string().contains("do not fit"), "{err}");
        })
        .unwrap();
    }

    #[test]
    fn data_that_arrives_with_the_clients_last_handshake_message_is_read() {
        let [a, b, ..] = configurations();
        crate::net::block_on_local(async {
            // Whether the data is in the server's last read of the
            // handshake is the network's call: a few tries make it sure.
            let mut carried = false;
            for _ in 0..10 {
                let (dialled, accepted) = sockets().await;
                // Without Nagle's wait, the data leaves as soon as written.
                dialled.set_nodelay(true).unwrap();
                // The server is not polled from the client's handshake's
                // end until the client has written: its Finished and the
                // data arrive together, and rustls opens the data.
                let server = accept(b.server(), accepted);
                tokio::pin!(server);
                let client = tokio::select! {
                    client = connect(a.client(), Tls::server_name(), dialled) => client.unwrap(),
                    _ = &mut server => panic!("the server's handshake ended before the client's"),
                };
                let (_client_read, mut client_write) = client.split(|err| err);
                client_write.write_all(b"first words").await.unwrap();
                client_write.flush().await.unwrap();
                let server = server.await.unwrap();
                carried |= !server.plain.is_empty();
                let (mut read, _write) = server.split(|err| err);
                let mut got = [0; 11];
                let reading = read.read_exact(&mut got);
                tokio::time::timeout(std::time::Duration::from_secs(10), reading)
                    .await
                    .expect("the data is read, not lost")
                    .unwrap();
                assert_eq!(&got, b"first words");
                if carried {
                    break;
                }
            }
            assert!(carried, "the data never came with the handshake");
        })
        .unwrap();
    }

    #[test]
    fn a_shutdown_ends_the_peers_stream_after_what_was_written() {
        let [a, b, ..] = configurations();
        crate::net::block_on_local(async {
            let (client, server) = handshakes(&a, &b).await;
            let (_client_read, mut client_write) = client.unwrap().split(|err| err);
            let (mut server_read, _server_write) = server.unwrap().split(|err| err);
            client_write.write_all(b"last words").await.unwrap();
            client_write.shutdown().await.unwrap();
            let mut got = Vec::new();
            server_read.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"last words");
            assert_eq!(server_read.read(&mut [0; 8]).await.unwrap(), 0);
        })
        .unwrap();
    }

    /// The rustls error inside `err`.
    fn rustls_error(err: &io::Error) -> &rustls::Error {
        err.get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .unwrap_or_else(|| panic!("not a rustls error: {err}"))
    }

    #[test]
    fn peers_of_another_ca_are_refused_and_told_why() {
        let [_, b, theirs, mixed] = configurations();
        crate::net::block_on_local(async {
            // The client refuses the server's certificate, and says so.
            let (client, server) = handshakes(&theirs, &b).await;
            let client = client.err().expect("the client refuses the server");
            assert!(
                matches!(rustls_error(&client), rustls::Error::InvalidCertificate(_)),
                "{client}"
            );
            let server = server.err().expect("the server is told");
            assert!(
                matches!(rustls_error(&server), rustls::Error::AlertReceived(_)),
                "{server}"
            );

            // The server refuses the client's certificate; TLS 1.3 lets the
            // client finish first, then tells it with an alert, which its
            // next write or read returns.
            let (client, server) = handshakes(&mixed, &b).await;
            let server = server.err().expect("the server refuses the client");
            assert!(
                matches!(rustls_error(&server), rustls::Error::InvalidCertificate(_)),
                "{server}"
            );
            let (mut read, mut write) = client
                .expect("the client trusts the server")
                .split(|err| err);
            let mut failed = None;
            for _ in 0..100 {
                if let Err(err) = async {
                    write.write_all(&[7; 1000]).await?;
                    write.flush().await
                }
                .await
                {
                    failed = Some(err);
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            let failed = match failed {
                Some(err) => err,
                None => read.read(&mut [0; 8]).await.expect_err("the server closed"),
            };
            assert!(
                matches!(rustls_error(&failed), rustls::Error::AlertReceived(_)),
                "{failed}"
            );
        })
        .unwrap();
    }

    #[test]
    fn a_peer_that_does_not_speak_tls_gets_an_alert_and_nothing_panics() {
        let [_, b, ..] = configurations();
        crate::net::block_on_local(async {
            let (mut dialled, accepted) = sockets().await;
            let server = accept(b.server(), accepted);
            let plain = async {
                dialled.write_all(&[0; 64]).await.unwrap();
                let mut answer = Vec::new();
                dialled.read_to_end(&mut answer).await.unwrap();
                answer
            };
            let (server, answer) = tokio::join!(server, plain);
            let err = server.err().expect("the server refuses a peer without TLS");
            assert!(
                matches!(rustls_error(&err), rustls::Error::InvalidMessage(_)),
                "{err}"
            );
            // One alert record: type 21, the alert's two bytes last
            // (fatal, decode_error).
            assert_eq!(answer.first(), Some(&21), "{answer:?}");
            assert!(answer.ends_with(&[2, 50]), "{answer:?}");
        })
        .unwrap();
    }

    /// A connected pair of loopback sockets: one for tokio, one for a
    /// blocking rustls peer on a thread of its own. Call inside a runtime.
    fn socket_and_std_socket() -> (TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let std_socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        (TcpStream::from_std(ours).unwrap(), std_socket)
    }

    /// rustls itself as the peer: reads messages (a 4-byte length, then
    /// the bytes) and answers each with its bytes plus one, in pieces,
    /// asking for a key update before each piece. At the end of the
    /// stream, which must be a close_notify, it sends its own. Returns the
    /// messages answered.
    fn rustls_echo<C, S>(
        mut stream: rustls::StreamOwned<C, std::net::TcpStream>,
    ) -> io::Result<usize>
    where
        C: std::ops::DerefMut + std::ops::Deref<Target = rustls::ConnectionCommon<S>>,
        S: rustls::SideData,
    {
        use std::io::{Read, Write};
        let mut answered = 0;
        loop {
            let mut len = [0; 4];
            // Ok(0) only after a close_notify; a bare close is an error.
            if stream.read(&mut len[..1])? == 0 {
                break;
            }
            stream.read_exact(&mut len[1..])?;
            let mut bytes = vec![0; u32::from_le_bytes(len) as usize];
            stream.read_exact(&mut bytes)?;
            for byte in &mut bytes {
                *byte = byte.wrapping_add(1);
            }
            for piece in bytes.chunks(40_000) {
                stream
                    .conn
                    .refresh_traffic_keys()
                    .map_err(io::Error::other)?;
                stream.write_all(piece)?;
            }
            stream.flush()?;
            answered += 1;
        }
        stream.conn.send_close_notify();
        stream.flush()?;
        Ok(answered)
    }

    /// Sends each of `lens` bytes as a message to a [`rustls_echo`] peer
    /// over `sealed`, each key sealing `limit` records at most if given,
    /// and checks each answer; then closes and reads the peer's
    /// close_notify.
    async fn echo_through(mut sealed: Sealed, lens: &[usize], limit: Option<u64>) {
        if let Some(limit) = limit {
            sealed.records.limit_records_per_key(limit);
        }
        let (mut read, mut write) = sealed.split(|err| err);
        for (i, &len) in lens.iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|j| (i * 31 + j % 253) as u8).collect();
            let mut message = (len as u32).to_le_bytes().to_vec();
            message.extend_from_slice(&bytes);
            send(&mut write, &message, &[7, 20_000, 100_000]).await;
            if i > 0 && lens[i - 1] > 0 && message.len() <= 7 {
                // The peer asked for a key update before its last answer:
                // this one record went under the key that answered it.
                let sealed = write.0.sealed.borrow();
                assert_eq!(sealed.records.sealed_with_this_key(), 1, "message {i}");
            }
            let answer = receive(&mut read, len, &[5_000, 70_000]).await;
            let expected: Vec<u8> = bytes.iter().map(|b| b.wrapping_add(1)).collect();
            assert!(
                answer == expected,
                "message {i} of {len} bytes came back changed"
            );
        }
        write.shutdown().await.unwrap();
        assert_eq!(
            read.read(&mut [0; 8]).await.unwrap(),
            0,
            "the peer's close_notify"
        );
    }

    /// Message lengths that cross record, piece and send-limit boundaries.
    const ECHO_LENS: [usize; 7] = [0, 1, 16_380, 16_385, 99_999, 400_000, 3];

    #[test]
    fn records_sealed_here_are_opened_by_rustls_and_back_across_key_updates_as_a_client() {
        let [a, b, ..] = configurations();
        // Tickets too, which the client hands to rustls.
        let mut server = (*b.server()).clone();
        server.send_tls13_tickets = 2;
        let server = Arc::new(server);
        crate::net::block_on_local(async {
            let (ours, theirs) = socket_and_std_socket();
            let peer = std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(server).unwrap();
                rustls_echo(rustls::StreamOwned::new(conn, theirs))
            });
            let sealed = connect(a.client(), Tls::server_name(), ours).await.unwrap();
            echo_through(sealed, &ECHO_LENS, Some(3)).await;
            assert_eq!(peer.join().unwrap().unwrap(), ECHO_LENS.len());
        })
        .unwrap();
    }

    #[test]
    fn records_sealed_here_are_opened_by_rustls_and_back_across_key_updates_as_a_server() {
        let [a, b, ..] = configurations();
        crate::net::block_on_local(async {
            let (ours, theirs) = socket_and_std_socket();
            let client = a.client();
            let peer = std::thread::spawn(move || {
                let conn = rustls::ClientConnection::new(client, Tls::server_name()).unwrap();
                rustls_echo(rustls::StreamOwned::new(conn, theirs))
            });
            let sealed = accept(b.server(), ours).await.unwrap();
            echo_through(sealed, &ECHO_LENS, None).await;
            assert_eq!(peer.join().unwrap().unwrap(), ECHO_LENS.len());
        })
        .unwrap();
    }

    /// How a sealed record is changed on its way.
    #[derive(Debug, Clone)]
    enum Tamper {
        /// One bit of the first record flipped.
        Flip { at: usize, bit: u8 },
        /// The first record sent twice.
        Replay,
        /// The second record sent before the first.
        Swap,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A record with any bit changed, sent again or out of order is
        /// refused: the reader gets what came before it and an error, the
        /// sender an alert, and no changed byte is read as data.
        #[test]
        fn a_record_changed_replayed_or_reordered_is_refused(
            lens in (0usize..3_000, 0usize..3_000),
            tamper in prop_oneof![
                (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Tamper::Flip { at, bit }),
                Just(Tamper::Replay),
                Just(Tamper::Swap),
            ],
        ) {
            let [a, b, ..] = configurations();
            let first: Vec<u8> = (0..lens.0).map(|i| i as u8).collect();
            let second: Vec<u8> = (0..lens.1).map(|i| (i * 7) as u8).collect();
            let (read, ended, told) = crate::net::block_on_local(async {
                let (client, server) = handshakes(&a, &b).await;
                let mut client = client.unwrap();
                let mut records = Vec::new();
                for data in [&first, &second] {
                    let mut room = vec![0; SEAL_ROOM];
                    let n = client
                        .records
                        .seal_data(&mut room, data.len(), |dest| dest.copy_from_slice(data))
                        .unwrap();
                    room.truncate(n);
                    records.push(room);
                }
                let bytes = match &tamper {
                    Tamper::Flip { at, bit } => {
                        let mut record = records[0].clone();
                        let at = at % record.len();
                        record[at] ^= 1 << bit;
                        record
                    }
                    Tamper::Replay => [&records[0][..], &records[0]].concat(),
                    Tamper::Swap => [&records[1][..], &records[0]].concat(),
                };
                client.link.socket.write_all(&bytes).await.unwrap();
                client.link.socket.shutdown().await.unwrap();
                let (mut server_read, server_write) = server.unwrap().split(|err| err);
                let (read, ended) = read_to_the_end(&mut server_read).await;
                drop((server_read, server_write));
                // What the server said back, opened by the client.
                let (mut client_read, _client_write) = client.split(|err| err);
                let told = client_read.read(&mut [0; 8]).await;
                (read, ended, told)
            })
            .unwrap();
            let expected: &[u8] = match tamper {
                Tamper::Replay => &first,
                _ => &[],
            };
            prop_assert!(read == expected, "read {} bytes, expected {}", read.len(), expected.len());
            let err = ended.expect_err("a changed record ends the stream with an error");
            // A header whose length grew waits for bytes that never come.
            let cut_short = err.kind() == io::ErrorKind::UnexpectedEof;
            if !cut_short {
                let alert = match rustls_error(&err) {
                    rustls::Error::DecryptError => AlertDescription::BadRecordMac,
                    rustls::Error::InappropriateMessage { .. } => AlertDescription::UnexpectedMessage,
                    rustls::Error::PeerSentOversizedRecord => AlertDescription::RecordOverflow,
                    other => panic!("unexpected error {other:?}"),
                };
                let told = told.expect_err("the client is told");
                prop_assert!(
                    matches!(rustls_error(&told), rustls::Error::AlertReceived(got) if *got == alert),
                    "{told}"
                );
            }
        }
    }
}
