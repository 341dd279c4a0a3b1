//! rustls's side of a TLS connection: one call into its unbuffered API,
//! and what it asks done with the connection's buffers (data it opened to
//! the reader, records it sealed to the socket). rustls seals and opens
//! every record; nothing here reads or writes one.

use std::io::{self, IoSlice};

use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::CertificateDer;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, UnbufferedStatus, WriteTraffic,
};
use tokio::io::ReadBuf;

use super::window::Window;
use super::{DATA_MAX, RECORD_OVERHEAD, SEND_LIMIT, invalid};

/// One end of a TLS connection: client or server.
pub(super) enum Session {
    /// This end dialled.
    Client(Box<UnbufferedClientConnection>),
    /// This end accepted.
    Server(Box<UnbufferedServerConnection>),
}

impl Session {
    pub(super) fn is_handshaking(&self) -> bool {
        match self {
            Session::Client(c) => c.is_handshaking(),
            Session::Server(s) => s.is_handshaking(),
        }
    }

    /// Whether rustls has records to send (an alert, handshake records).
    pub(super) fn wants_write(&self) -> bool {
        match self {
            Session::Client(c) => c.wants_write(),
            Session::Server(s) => s.wants_write(),
        }
    }

    /// The certificates the peer presented, its own first, once rustls has
    /// checked them.
    pub(super) fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        match self {
            Session::Client(c) => c.peer_certificates(),
            Session::Server(s) => s.peer_certificates(),
        }
    }

    /// Hands rustls `records` (received, not yet used) and moves the
    /// connection on by one state: see [`step`].
    pub(super) fn advance(
        &mut self,
        records: &mut [u8],
        buffers: Buffers<'_>,
        request: Request<'_, '_>,
    ) -> (usize, io::Result<Step>) {
        match self {
            Session::Client(c) => step(c.process_tls_records(records), buffers, request),
            Session::Server(s) => step(s.process_tls_records(records), buffers, request),
        }
    }
}

/// The buffers rustls's output goes to.
pub(super) struct Buffers<'a> {
    /// Data opened that the reader has no room for yet.
    pub(super) plain: &'a mut Window,
    /// Sealed records for the socket.
    pub(super) out: &'a mut Window,
    /// A write's short slices, joined into whole records' worth.
    pub(super) staging: &'a mut Vec<u8>,
}

/// What the connection is asked to do with its records.
pub(super) enum Request<'a, 'b> {
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
pub(super) enum Step {
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

/// Moves a connection on by one state: opens data records (into the
/// request's `dest`, then `plain`), encodes handshake records into `out`,
/// seals a request's data or close_notify. Returns the bytes of records
/// used up and where the connection is.
fn step<D>(
    status: UnbufferedStatus<'_, '_, D>,
    buffers: Buffers<'_>,
    request: Request<'_, '_>,
) -> (usize, io::Result<Step>) {
    let Buffers {
        plain,
        out,
        staging,
    } = buffers;
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
                    Err(err) => return (discard, Err(invalid(err))),
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
            Request::Write(data) => seal(&mut traffic, data, staging, out).map(Step::Sealed),
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

/// Has rustls seal `data`, taken as one stream and up to [`SEND_LIMIT`]
/// bytes of it, into `out`. Whole records' worth of a slice are sealed
/// where they are; what is left of each slice is joined in `staging` with
/// what follows, and sealed once it fills a record or the data ends, so
/// that only the write's last record is short. Returns the bytes sealed.
fn seal<D>(
    traffic: &mut WriteTraffic<'_, D>,
    data: &[IoSlice<'_>],
    staging: &mut Vec<u8>,
    out: &mut Window,
) -> io::Result<usize> {
    staging.clear();
    let mut taken = 0;
    for slice in data {
        let mut rest = &slice[..slice.len().min(SEND_LIMIT - taken)];
        taken += rest.len();
        if !staging.is_empty() {
            let n = rest.len().min(DATA_MAX - staging.len());
            staging.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if staging.len() < DATA_MAX {
                continue;
            }
            encrypt(traffic, staging, out)?;
            staging.clear();
        }
        let whole = rest.len() - rest.len() % DATA_MAX;
        encrypt(traffic, &rest[..whole], out)?;
        staging.extend_from_slice(&rest[whole..]);
    }
    encrypt(traffic, staging, out)?;
    staging.clear();
    Ok(taken)
}

/// Has rustls seal `data` as records at the end of `out`.
fn encrypt<D>(traffic: &mut WriteTraffic<'_, D>, data: &[u8], out: &mut Window) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let mut need = data.len() + data.len().div_ceil(DATA_MAX) * RECORD_OVERHEAD;
    loop {
        match traffic.encrypt(data, out.room(need)) {
            Ok(n) => {
                out.end += n;
                return Ok(());
            }
            // A key update rustls sends first, or another cipher's overhead.
            Err(EncryptError::InsufficientSize(size)) => need = size.required_size,
            Err(err) => return Err(io::Error::other(err)),
        }
    }
}
