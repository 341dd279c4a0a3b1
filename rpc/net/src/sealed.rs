//! A TLS connection over rustls's unbuffered API. rustls does all of TLS:
//! the handshake, then every record either way, sealed and opened by its
//! own record layer (with its key updates, its limits on records and on
//! what a peer may send, its alerts). This module only moves bytes: from
//! the socket to rustls and from rustls to the reader, from the writer to
//! rustls and from rustls to the socket.
//!
//! - The socket's bytes are read, as many as it has, into one buffer of
//!   [`INCOMING`] bytes allocated once (compacted only when its tail has no
//!   room for a whole record) and handed to rustls there: rustls opens each
//!   record in place, and its data is copied into the reader's buffer.
//!   rustls 0.23 copies each opened record's data into a `Vec` of its own
//!   first; its API has no way around that.
//! - A write's slices are handed to rustls whole, to be sealed straight
//!   into the buffer the socket writes from; slices shorter than a record
//!   are joined first, so that records are full. rustls 0.23 seals each
//!   record in a `Vec` of its own and copies it into that buffer.
//! - No code here reads a record header or a handshake message: whatever a
//!   peer sends, before its handshake ends or after it, is parsed by rustls
//!   alone. This module counts bytes, and refuses a peer whose records do
//!   not fit its buffer.
//! - A stream ends at the peer's close_notify; nothing the peer sends after
//!   it is read, and a write after it fails. A socket that ends without a
//!   close_notify is an error ([`io::ErrorKind::UnexpectedEof`]), never the
//!   end of the stream: what the peer sent may have been cut short.
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
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::UnbufferedServerConnection;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

mod session;
mod window;

use session::{Buffers, Request, Session, Step};
use window::Window;

/// Bytes of sealed records the incoming buffer holds: a read takes up to
/// this much from the socket at once.
const INCOMING: usize = 256 << 10;

/// The largest sealed record TLS allows (2^14 bytes of data, 256 of
/// expansion, a 5-byte header): the incoming buffer is compacted when its
/// tail has less room than this.
const RECORD_MAX: usize = (16 << 10) + 256 + 5;

/// The most data one record holds (2^14 bytes): rustls cuts what it seals
/// into records of this much.
const DATA_MAX: usize = 16 << 10;

/// What sealing adds to each record of TLS 1.3 with AES-GCM or ChaCha20:
/// the header, the content type and the tag.
const RECORD_OVERHEAD: usize = 5 + 1 + 16;

/// Bytes of data one write seals at most, and bytes of sealed records held
/// before a write waits for the socket to take some.
const SEND_LIMIT: usize = 320 << 10;

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
    /// A write's short slices, joined before rustls seals them.
    staging: Vec<u8>,
    /// The peer sent close_notify.
    peer_closed: bool,
    /// This end sealed its close_notify.
    closing: bool,
    /// The read half, waiting for records, to wake when the write half
    /// opened some.
    reader: Option<Waker>,
    /// What failed, once rustls, the socket or the buffers did: nothing
    /// more is opened or sealed after it.
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
            incoming: Window::with_len(INCOMING),
            plain: Window::default(),
            out: Window::default(),
            staging: Vec::with_capacity(DATA_MAX),
            peer_closed: false,
            closing: false,
            reader: None,
            failed: None,
        }
    }

    /// The certificate the peer presented for itself (the first of its
    /// chain), which rustls checked against the CA during the handshake
    /// and keeps: with mutual TLS, both ends have one.
    pub(super) fn peer_certificate(&self) -> Option<&CertificateDer<'static>> {
        self.session.peer_certificates()?.first()
    }

    /// Moves the connection on by one state. The first error is rustls's
    /// (inside the `io::Error`); the peer is sent the alert rustls chose for
    /// it, and every later call fails the same way.
    fn process(&mut self, request: Request<'_, '_>) -> io::Result<Step> {
        if let Some(failed) = &self.failed {
            return Err(failed.error());
        }
        let reading = matches!(request, Request::Read(_));
        let Sealed {
            session,
            incoming,
            plain,
            out,
            staging,
            ..
        } = self;
        let records = &mut incoming.bytes[incoming.start..incoming.end];
        let buffers = Buffers {
            plain,
            out,
            staging,
        };
        let (discard, step) = session.advance(records, buffers, request);
        incoming.consume(discard);
        match &step {
            Ok(Step::PeerClosed | Step::Closed) => self.peer_closed = true,
            Ok(_) => {}
            Err(err) => {
                self.failed = Some(Failure::of(err));
                self.send_alert();
            }
        }
        if !reading {
            self.wake_reader();
        }
        step
    }

    /// Fails the connection with `err`, which every later call returns.
    fn fail(&mut self, err: io::Error) -> io::Error {
        self.failed = Some(Failure::of(&err));
        self.wake_reader();
        err
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
            staging,
            ..
        } = self;
        let mut plain = Window::default();
        for _ in 0..4 {
            if !session.wants_write() {
                break;
            }
            let records = &mut incoming.bytes[incoming.start..incoming.end];
            let buffers = Buffers {
                plain: &mut plain,
                out,
                staging,
            };
            let (discard, _) = session.advance(records, buffers, Request::Read(None));
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
        if self.incoming.spare() < RECORD_MAX {
            self.incoming.compact();
            if self.incoming.spare() < RECORD_MAX {
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
            if self.peer_closed || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let step = match self.process(Request::Read(Some(buf))) {
                Ok(step) => step,
                // What was opened before the error is read first; the
                // error, kept, is the next call's.
                Err(_) if buf.filled().len() > before => return Poll::Ready(Ok(())),
                Err(err) => return Poll::Ready(Err(err)),
            };
            match step {
                Step::Again | Step::Sealed(_) => {}
                Step::PeerClosed | Step::Closed => return Poll::Ready(Ok(())),
                Step::Blocked | Step::Writable => {
                    // What rustls encoded (an answer to a key update) leaves.
                    self.try_drain();
                    // Every whole record is opened.
                    if buf.filled().len() > before {
                        return Poll::Ready(Ok(()));
                    }
                    match self.poll_fill(cx) {
                        Poll::Ready(Ok(0)) => return Poll::Ready(Err(self.cut_short())),
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(err)) => return Poll::Ready(Err(self.fail(err))),
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

    /// Fails the connection whose socket ended before the peer's
    /// close_notify: with part of a record unread, or between records,
    /// where what the peer sent may have been cut short unseen.
    fn cut_short(&mut self) -> io::Error {
        let why = if self.incoming.is_empty() {
            "the peer closed its connection without a TLS close_notify: what it sent may have \
             been cut short"
        } else {
            "the peer closed its connection without a TLS close_notify, in the middle of a TLS \
             record"
        };
        self.fail(io::Error::new(io::ErrorKind::UnexpectedEof, why))
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
            if self.peer_closed || self.closing {
                return Poll::Ready(Err(self.closed_error()));
            }
            match self.process(Request::Write(data))? {
                Step::Sealed(n) => return Poll::Ready(Ok(n)),
                Step::Again | Step::PeerClosed | Step::Closed | Step::Writable => {}
                Step::Blocked => {
                    return Poll::Ready(Err(io::Error::other(
                        "a TLS connection cannot send before its handshake ends",
                    )));
                }
            }
        }
    }

    /// Why nothing more can be sent: the peer's close_notify (it reads
    /// nothing more), or this end's own.
    fn closed_error(&self) -> io::Error {
        let why = if self.peer_closed {
            "the peer ended the TLS connection (close_notify): it reads nothing more"
        } else {
            "this end ended the TLS connection (close_notify): nothing more can be sent"
        };
        io::Error::new(io::ErrorKind::BrokenPipe, why)
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
            while self.incoming.spare() > 0 {
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

    /// Wakes the read half if there is something for it: data the write
    /// half opened, the peer's close_notify, a failure.
    fn wake_reader(&mut self) {
        if (!self.plain.is_empty() || self.peer_closed || self.failed.is_some())
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
/// when it fails. Data the peer sent right after its last handshake
/// message, which rustls may open with it, waits in `plain`.
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
            // A close_notify right after the peer's last handshake message
            // (and its last data): the stream's end comes after them.
            Step::PeerClosed | Step::Closed if !sealed.session.is_handshaking() => {
                return Ok(sealed);
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
mod tests;
