//! A TLS connection over rustls's unbuffered API: sealed records are read
//! from the socket straight into one buffer and opened there, and a write's
//! records are put in another that the socket writes from.
//!
//! rustls's buffered connection (what tokio-rustls wraps) reads records
//! 4 KiB at a time into a buffer it grows and shrinks again for every
//! record and moves what is left to the front after each one. Here the
//! incoming buffer is allocated once and compacted only when its tail has
//! no room for a whole record. What rustls 0.23 still does either way: it
//! copies each opened record into a new `Vec` before handing it out, and
//! seals each outgoing record in a new `Vec` (which the unbuffered API then
//! copies into the outgoing buffer).
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
use std::task::{Context, Poll, Waker, ready};

use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, UnbufferedStatus};
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes of sealed records the incoming buffer holds: a read takes up to
/// this much from the socket at once.
const INCOMING: usize = 256 << 10;

/// The largest sealed record TLS allows (2^14 bytes of data, 256 of
/// expansion, a 5-byte header): the incoming buffer is compacted when its
/// tail has less room than this.
const RECORD_MAX: usize = (16 << 10) + 256 + 5;

/// Bytes of plaintext one write seals at most, and bytes of sealed records
/// held before a write waits for the socket to take some.
const SEND_LIMIT: usize = 320 << 10;

/// What sealing adds to each record of TLS 1.3 with AES-GCM or ChaCha20:
/// the header, the content type and the tag.
const RECORD_OVERHEAD: usize = 5 + 1 + 16;

/// One end of a TLS connection: client or server.
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
        request: Request<'_, '_>,
    ) -> (usize, io::Result<Step>) {
        match self {
            Session::Client(c) => step(c.process_tls_records(records), plain, out, request),
            Session::Server(s) => step(s.process_tls_records(records), plain, out, request),
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

/// What the connection is asked to do with its records.
enum Request<'a, 'b> {
    /// Open what has arrived, putting data into `dest` where there is room.
    Read(Option<&'a mut ReadBuf<'b>>),
    /// Seal these bytes, in order and up to [`SEND_LIMIT`] of them, once
    /// the connection may send data.
    Write(&'a [IoSlice<'b>]),
    /// Seal a close_notify alert.
    Close,
}

/// Where one call into rustls left the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// It did something (opened data, encoded handshake records): ask again.
    Again,
    /// It needs more records from the peer before anything else.
    Blocked,
    /// It has nothing to do but may send data.
    Writable,
    /// It sealed this many bytes of the request's data.
    Sealed(usize),
    /// The peer sent close_notify.
    PeerClosed,
    /// Both ends sent close_notify.
    Closed,
}

/// Moves a connection on by one state: opens data records (into `dest`,
/// then `plain`), encodes handshake records into `out`, seals a request.
/// Returns the bytes of records used up and where the connection is.
fn step<D>(
    status: UnbufferedStatus<'_, '_, D>,
    plain: &mut Window,
    out: &mut Window,
    request: Request<'_, '_>,
) -> (usize, io::Result<Step>) {
    let mut discard = status.discard;
    let state = match status.state {
        Ok(state) => state,
        Err(err) => return (discard, Err(invalid(err))),
    };
    let step = match state {
        ConnectionState::ReadTraffic(mut traffic) => {
            let mut dest = match request {
                Request::Read(dest) if plain.is_empty() => dest,
                _ => None,
            };
            while let Some(record) = traffic.next_record() {
                let record = match record {
                    Ok(record) => record,
                    Err(err) => {
                        return (discard, Err(invalid(err)));
                    }
                };
                discard += record.discard;
                let mut payload = record.payload;
                if let Some(dest) = dest.as_deref_mut() {
                    let n = dest.remaining().min(payload.len());
                    dest.put_slice(&payload[..n]);
                    payload = &payload[n..];
                }
                if !payload.is_empty() {
                    plain.push(payload);
                    dest = None;
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
        ConnectionState::BlockedHandshake => Ok(Step::Blocked),
        ConnectionState::WriteTraffic(mut traffic) => match request {
            Request::Read(_) => Ok(Step::Writable),
            Request::Write(data) => {
                let mut sealed = 0;
                let mut failed = None;
                for slice in data {
                    let slice = &slice[..slice.len().min(SEND_LIMIT - sealed)];
                    if slice.is_empty() {
                        continue;
                    }
                    let records = slice.len().div_ceil(16 << 10).max(1);
                    let mut need = slice.len() + records * RECORD_OVERHEAD;
                    loop {
                        match traffic.encrypt(slice, out.room(need)) {
                            Ok(n) => {
                                out.end += n;
                                sealed += slice.len();
                                break;
                            }
                            Err(EncryptError::InsufficientSize(size)) => need = size.required_size,
                            Err(err) => {
                                failed = Some(io::Error::other(err));
                                break;
                            }
                        }
                    }
                    if failed.is_some() {
                        break;
                    }
                }
                match failed {
                    Some(err) if sealed == 0 => Err(err),
                    _ => Ok(Step::Sealed(sealed)),
                }
            }
            Request::Close => loop {
                match traffic.queue_close_notify(out.room(RECORD_OVERHEAD + 2)) {
                    Ok(n) => {
                        out.end += n;
                        break Ok(Step::Sealed(0));
                    }
                    Err(EncryptError::InsufficientSize(size)) => {
                        out.room(size.required_size);
                    }
                    Err(err) => break Err(io::Error::other(err)),
                }
            },
        },
        ConnectionState::PeerClosed => Ok(Step::PeerClosed),
        ConnectionState::Closed => Ok(Step::Closed),
        other => Err(invalid(format!("unexpected TLS state {other:?}"))),
    };
    (discard, step)
}

/// A TLS connection and its buffers.
pub(super) struct Sealed {
    session: Session,
    socket: TcpStream,
    /// Sealed records read, not yet opened.
    incoming: Window,
    /// Data opened, not yet read.
    plain: Window,
    /// Sealed records not yet written to the socket.
    out: Window,
    /// The peer sent close_notify, or closed its socket.
    peer_closed: bool,
    /// This end sealed its close_notify.
    closing: bool,
    /// The read half, waiting for records, to wake when the write half
    /// opened some.
    reader: Option<Waker>,
    /// What failed, once rustls or the buffers did: nothing more is opened
    /// or sealed after it.
    failed: Option<Failure>,
}

/// The first error of a connection, kept to fail every later call alike.
enum Failure {
    /// rustls's: returned inside each `io::Error`, so that a caller can
    /// tell an alert from the peer.
    Tls(rustls::Error),
    /// Any other.
    Other(io::ErrorKind, String),
}

impl Failure {
    fn of(err: &io::Error) -> Failure {
        match err
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        {
            Some(tls) => Failure::Tls(tls.clone()),
            None => Failure::Other(err.kind(), err.to_string()),
        }
    }

    fn error(&self) -> io::Error {
        match self {
            Failure::Tls(err) => invalid(err.clone()),
            Failure::Other(kind, text) => io::Error::new(*kind, text.clone()),
        }
    }
}

impl Sealed {
    /// A connection of `session` over `socket`, before its handshake.
    fn new(session: Session, socket: TcpStream) -> Sealed {
        Sealed {
            session,
            socket,
            incoming: Window {
                bytes: vec![0; INCOMING],
                ..Window::default()
            },
            plain: Window::default(),
            out: Window::default(),
            peer_closed: false,
            closing: false,
            reader: None,
            failed: None,
        }
    }

    /// Moves the connection on by one state. The first error is rustls's
    /// (inside the `io::Error`); the peer is sent the alert rustls chose for
    /// it, and every later call fails the same way.
    fn process(&mut self, request: Request<'_, '_>) -> io::Result<Step> {
        if let Some(failed) = &self.failed {
            return Err(failed.error());
        }
        let Sealed {
            session,
            incoming,
            plain,
            out,
            ..
        } = self;
        let records = &mut incoming.bytes[incoming.start..incoming.end];
        let (discard, step) = session.advance(records, plain, out, request);
        incoming.consume(discard);
        match step {
            Ok(Step::PeerClosed) => self.peer_closed = true,
            Ok(_) => {}
            Err(err) => {
                self.failed = Some(Failure::of(&err));
                self.send_alert();
                return Err(err);
            }
        }
        step
    }

    /// After an error, encodes the alert rustls queued for the peer and
    /// tries to send it without waiting. rustls is asked only while it has
    /// records to send, which it hands out before it looks at any it
    /// received: those that failed would fail again.
    fn send_alert(&mut self) {
        let Sealed {
            session,
            incoming,
            out,
            ..
        } = self;
        let mut plain = Window::default();
        for _ in 0..4 {
            if !session.wants_write() {
                break;
            }
            let records = &mut incoming.bytes[incoming.start..incoming.end];
            let (discard, _) = session.advance(records, &mut plain, out, Request::Read(None));
            incoming.consume(discard);
        }
        self.try_drain();
    }

    /// Writes what sealed records the socket takes now, without waiting:
    /// what the read half encoded (an answer to a key update, an alert)
    /// goes out without taking the write half's place in the socket's
    /// wake-ups. Errors are left for the write half to find.
    fn try_drain(&mut self) {
        while !self.out.is_empty() {
            match self.socket.try_write(self.out.pending()) {
                Ok(n @ 1..) => self.out.consume(n),
                _ => break,
            }
        }
    }

    /// Reads what the socket has into the incoming buffer, which never
    /// grows; `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.incoming.bytes.len() - self.incoming.end < RECORD_MAX {
            self.incoming.compact();
            if self.incoming.bytes.len() - self.incoming.end < RECORD_MAX {
                return Poll::Ready(Err(invalid(format!(
                    "the peer's TLS records do not fit in {} KiB (a record too large, or a \
                     handshake message in too many pieces)",
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

    /// Writes every sealed record held to the socket.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let written = ready!(Pin::new(&mut self.socket).poll_write(cx, self.out.pending()));
            let n = written.map_err(|err| self.explain(err))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.consume(n);
        }
        Poll::Ready(Ok(()))
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        loop {
            if !self.plain.is_empty() {
                self.plain.take_into(buf);
                return Poll::Ready(Ok(()));
            }
            if self.peer_closed {
                return Poll::Ready(Ok(()));
            }
            let step = self.process(Request::Read(Some(buf)))?;
            match step {
                Step::Again if buf.filled().len() > before => return Poll::Ready(Ok(())),
                Step::Again | Step::Sealed(_) | Step::PeerClosed => {}
                Step::Closed => return Poll::Ready(Ok(())),
                Step::Blocked | Step::Writable => {
                    self.try_drain();
                    match self.poll_fill(cx) {
                        // What rustls could open it has: the rest is a
                        // record cut short.
                        Poll::Ready(Ok(0)) if !self.incoming.is_empty() => {
                            let err = io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "the peer closed its connection in the middle of a TLS record",
                            );
                            self.failed = Some(Failure::of(&err));
                            return Poll::Ready(Err(err));
                        }
                        Poll::Ready(Ok(0)) => self.peer_closed = true,
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                        Poll::Pending => {
                            if !self
                                .reader
                                .as_ref()
                                .is_some_and(|w| w.will_wake(cx.waker()))
                            {
                                self.reader = Some(cx.waker().clone());
                            }
                            return Poll::Pending;
                        }
                    }
                }
            }
        }
    }

    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.out.pending().len() >= SEND_LIMIT {
            if let Poll::Ready(Err(err)) = self.poll_drain(cx) {
                return Poll::Ready(Err(err));
            }
            if self.out.pending().len() >= SEND_LIMIT {
                return Poll::Pending;
            }
        }
        if data.iter().all(|slice| slice.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        loop {
            let step = self.process(Request::Write(data));
            self.wake_reader();
            match step? {
                Step::Sealed(n) => return Poll::Ready(Ok(n)),
                Step::Again | Step::PeerClosed | Step::Writable => {}
                Step::Blocked => {
                    return Poll::Ready(Err(io::Error::other(
                        "a TLS connection cannot send before its handshake ends",
                    )));
                }
                Step::Closed => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.closing {
            while let Step::Again | Step::PeerClosed = self.process(Request::Close)? {}
            self.closing = true;
        }
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.socket).poll_shutdown(cx)
    }

    /// The error to report for `err`, a socket's failed write: the peer
    /// may have closed the connection after an alert saying why (a server
    /// refusing a TLS 1.3 client's certificate does so after the client's
    /// handshake ended), and then the alert is the error.
    fn explain(&mut self, err: io::Error) -> io::Error {
        if self.failed.is_none() {
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
            for _ in 0..8 {
                if !matches!(self.process(Request::Read(None)), Ok(Step::Again)) {
                    break;
                }
            }
        }
        match &self.failed {
            Some(failed) => failed.error(),
            None => err,
        }
    }

    /// Wakes the read half if the write half opened data for it.
    fn wake_reader(&mut self) {
        if (!self.plain.is_empty() || self.peer_closed)
            && let Some(reader) = self.reader.take()
        {
            reader.wake();
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

/// The server's end of a connection accepted on `socket`, once its
/// handshake is done. A failed handshake's error holds rustls's, and the
/// peer was sent the alert rustls chose.
pub(super) async fn accept(config: Arc<ServerConfig>, socket: TcpStream) -> io::Result<Sealed> {
    let session = UnbufferedServerConnection::new(config).map_err(invalid)?;
    handshake(Sealed::new(Session::Server(Box::new(session)), socket)).await
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
    handshake(Sealed::new(Session::Client(Box::new(session)), socket)).await
}

/// A rustls error as an I/O error that holds it.
fn invalid(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err)
}

/// Runs `sealed`'s handshake to its end, sending the peer rustls's alert
/// when it fails.
async fn handshake(mut sealed: Sealed) -> io::Result<Sealed> {
    loop {
        match sealed.process(Request::Read(None))? {
            Step::Again | Step::Sealed(_) => {}
            Step::Blocked | Step::Writable => {
                poll_fn(|cx| sealed.poll_drain(cx)).await?;
                if !sealed.session.is_handshaking() {
                    return Ok(sealed);
                }
                if poll_fn(|cx| sealed.poll_fill(cx)).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
            Step::PeerClosed | Step::Closed => return Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
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
        tls::generate(&dir.path().join("ours"), &["a", "b"]).unwrap();
        tls::generate(&dir.path().join("theirs"), &["c"]).unwrap();
        let load = |path: &str| Tls::load(&dir.path().join(path)).unwrap();
        let mixed = tls::Files {
            ca: dir.path().join("ours/ca.pem"),
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
            connect(client.client.clone(), Tls::server_name(), dialled),
            accept(server.server.clone(), accepted)
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
                    accept(b.server.clone(), accepted),
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
                let socket = shared.sealed.into_inner().socket;
                let peer = send_and_close(socket, unsealed);
                let server = async move {
                    let mut read = Vec::new();
                    let mut buf = vec![0; 64 << 10];
                    let ended = loop {
                        match server_read.read(&mut buf).await {
                            Ok(0) => break Ok(()),
                            Ok(n) => read.extend_from_slice(&buf[..n]),
                            Err(err) => break Err(err),
                        }
                    };
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
            let (server, ()) = tokio::join!(accept(b.server.clone(), accepted), peer);
            let err = server.err().expect("the server refuses it");
            assert!(err.to_string().contains("do not fit"), "{err}");
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
            let server = accept(b.server.clone(), accepted);
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
}
