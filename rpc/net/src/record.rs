//! TLS 1.3 records (RFC 8446 §5) sealed and opened in place with *ring*,
//! once rustls has run the handshake.
//!
//! rustls 0.23 seals each outgoing record in a `Vec` of its own and copies
//! each opened record into another before handing it over; with its state
//! machine around every record, that was about a third of what TLS added
//! to a query. So once the handshake is done, rustls hands over the traffic
//! keys through the API it has for kernel TLS
//! (`dangerous_into_kernel_connection`) and keeps the key schedule; this
//! module is the record layer and nothing else:
//!
//! - a record is sealed straight into the caller's buffer and opened where
//!   it was read; on the wire every record is `application_data`, its real
//!   type the last byte inside (§5.2);
//! - each record's nonce is its key's IV XOR its sequence number, counted
//!   per key from where rustls left it (§5.3);
//! - a key seals at most its cipher suite's confidentiality limit of
//!   records, then a KeyUpdate switches to the next one rustls derives
//!   (§4.6.3); a peer's KeyUpdate switches the key that opens its records,
//!   and one that asks for ours is answered before the next data record;
//! - an alert ends the connection: close_notify as the end of the stream,
//!   any other as an error naming it; a NewSessionTicket sent to a client
//!   goes to rustls; nothing else is accepted after the handshake.

use std::ops::Range;

use ring::aead::{self, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{
    AlertDescription, ConnectionTrafficSecrets, ContentType, Error, ExtractedSecrets,
    HandshakeType, InvalidMessage,
};

/// A record's header: its type, the legacy version, its length.
const HEADER: usize = 5;

/// The most data one record holds: 2^14 bytes.
pub(super) const DATA_MAX: usize = 1 << 14;

/// The authentication tag of every AEAD of TLS 1.3.
const TAG: usize = 16;

/// The longest record a peer may send: 2^14 bytes of data and 256 of
/// expansion after the header (§5.2).
pub(super) const RECORD_MAX: usize = HEADER + DATA_MAX + 256;

/// What sealing adds to what a record holds: the header, the inner content
/// type, the tag.
pub(super) const OVERHEAD: usize = HEADER + 1 + TAG;

/// A KeyUpdate message: its type, its length (one byte), the byte.
const KEY_UPDATE_LEN: usize = 5;

/// The room one [`Records::seal_data`] needs at most: a KeyUpdate's record
/// and the data's.
pub(super) const SEAL_ROOM: usize = KEY_UPDATE_LEN + OVERHEAD + DATA_MAX + OVERHEAD;

/// Content types (§5.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

/// Handshake message types this layer meets (§4).
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// What rustls keeps of a connection once its records are ours: the key
/// schedule, and a client's session tickets.
pub(super) enum Kernel {
    /// This end dialled.
    Client(KernelConnection<ClientConnectionData>),
    /// This end accepted.
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    /// The records a key may seal: its cipher suite's confidentiality limit.
    fn limit(&self) -> u64 {
        let suite = match self {
            Kernel::Client(kernel) => kernel.negotiated_cipher_suite(),
            Kernel::Server(kernel) => kernel.negotiated_cipher_suite(),
        };
        suite
            .tls13()
            .map_or(0, |suite| suite.common.confidentiality_limit)
    }

    /// The key that seals this end's records after a KeyUpdate.
    fn next_tx(&mut self) -> Result<Key, Error> {
        Key::new(match self {
            Kernel::Client(kernel) => kernel.update_tx_secret()?,
            Kernel::Server(kernel) => kernel.update_tx_secret()?,
        })
    }

    /// The key that opens the peer's records after its KeyUpdate.
    fn next_rx(&mut self) -> Result<Key, Error> {
        Key::new(match self {
            Kernel::Client(kernel) => kernel.update_rx_secret()?,
            Kernel::Server(kernel) => kernel.update_rx_secret()?,
        })
    }
}

/// One direction's key and the sequence number of its next record.
struct Key {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Key {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> Result<Key, Error> {
        let (algorithm, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => {
                return Err(Error::General(
                    "a cipher suite without TLS 1.3 records".into(),
                ));
            }
        };
        let unusable = || Error::General("rustls handed over a key of another length".into());
        Ok(Key {
            key: LessSafeKey::new(
                UnboundKey::new(algorithm, key.as_ref()).map_err(|_| unusable())?,
            ),
            iv: iv.as_ref().try_into().map_err(|_| unusable())?,
            seq,
        })
    }

    /// The nonce of the next record, which is then counted (§5.3).
    fn next_nonce(&mut self) -> Result<Nonce, Error> {
        let seq = self.seq;
        self.seq = seq
            .checked_add(1)
            .ok_or_else(|| Error::General("a TLS key sealed or opened 2^64 records".into()))?;
        let mut nonce = self.iv;
        for (byte, seq) in nonce[NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
            *byte ^= seq;
        }
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}

/// What a record held, once opened.
#[derive(Debug)]
pub(super) enum Opened {
    /// Data, at this range of the record.
    Data(Range<usize>),
    /// The peer's close_notify: it sends nothing more.
    Closed,
    /// A message for the connection itself (a key update, a session
    /// ticket): nothing to read.
    Control,
}

/// The record layer of one TLS 1.3 connection whose handshake is done.
pub(super) struct Records {
    kernel: Kernel,
    /// Seals this end's records.
    tx: Key,
    /// Opens the peer's.
    rx: Key,
    /// Records a sending key seals before the next replaces it.
    limit: u64,
    /// The peer asked for a KeyUpdate, which goes before the next data.
    update_asked: bool,
}

impl Records {
    /// The record layer of a connection whose handshake rustls ran, from
    /// what rustls hands over.
    pub(super) fn new(secrets: ExtractedSecrets, kernel: Kernel) -> Result<Records, Error> {
        let limit = kernel.limit();
        if limit == 0 {
            return Err(Error::General("a connection that is not TLS 1.3".into()));
        }
        Ok(Records {
            tx: Key::new(secrets.tx)?,
            rx: Key::new(secrets.rx)?,
            kernel,
            limit,
            update_asked: false,
        })
    }

    /// Makes each sending key seal at most `limit` records, to try key
    /// updates without sealing millions.
    #[cfg(test)]
    pub(super) fn limit_records_per_key(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Records sealed with this end's current key.
    #[cfg(test)]
    pub(super) fn sealed_with_this_key(&self) -> u64 {
        self.tx.seq
    }

    /// Seals `len` bytes of data (at most [`DATA_MAX`]), which `fill`
    /// writes, as one record at the start of `room` ([`SEAL_ROOM`] bytes at
    /// least); a KeyUpdate's record goes first when the sending key has
    /// sealed its share or the peer asked for one. Returns the bytes
    /// written.
    pub(super) fn seal_data(
        &mut self,
        room: &mut [u8],
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, Error> {
        let mut at = 0;
        if self.update_asked || self.tx.seq.saturating_add(1) >= self.limit {
            // update_not_requested: only this end's key changes.
            let message = [KEY_UPDATE, 0, 0, 1, 0];
            at = self.seal(HANDSHAKE, &message, room)?;
            self.tx = self.kernel.next_tx()?;
            self.update_asked = false;
        }
        let record = &mut room[at..at + len + OVERHEAD];
        fill(&mut record[HEADER..HEADER + len]);
        Ok(at + self.seal_in_place(APPLICATION_DATA, len, record)?)
    }

    /// Seals `content` as a record of any inner type `kind`, as a peer
    /// holding the keys may.
    #[cfg(test)]
    pub(super) fn seal_any(&mut self, kind: u8, content: &[u8], room: &mut [u8]) -> usize {
        self.seal(kind, content, room).expect("sealed")
    }

    /// Seals an alert at the start of `room` (`OVERHEAD + 2` bytes at
    /// least): close_notify as a warning, any other as fatal. Returns the
    /// bytes written.
    pub(super) fn seal_alert(
        &mut self,
        alert: AlertDescription,
        room: &mut [u8],
    ) -> Result<usize, Error> {
        let level = if alert == AlertDescription::CloseNotify {
            1
        } else {
            2
        };
        self.seal(ALERT, &[level, u8::from(alert)], room)
    }

    /// Seals `content` as a record of type `kind` at the start of `room`.
    fn seal(&mut self, kind: u8, content: &[u8], room: &mut [u8]) -> Result<usize, Error> {
        let record = &mut room[..content.len() + OVERHEAD];
        record[HEADER..HEADER + content.len()].copy_from_slice(content);
        self.seal_in_place(kind, content.len(), record)
    }

    /// Seals the `len` bytes of content that `record` holds after its
    /// header's place, as a record of type `kind` that fills `record`.
    fn seal_in_place(&mut self, kind: u8, len: usize, record: &mut [u8]) -> Result<usize, Error> {
        debug_assert_eq!(record.len(), len + OVERHEAD);
        let sealed = u16::try_from(len + 1 + TAG).expect("at most DATA_MAX bytes a record");
        let (header, body) = record.split_at_mut(HEADER);
        header[0] = APPLICATION_DATA;
        header[1..3].copy_from_slice(&[3, 3]);
        header[3..].copy_from_slice(&sealed.to_be_bytes());
        let (inner, tag) = body.split_at_mut(len + 1);
        inner[len] = kind;
        let nonce = self.tx.next_nonce()?;
        let sealed_tag = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(&header[..]), inner)
            .map_err(|_| Error::EncryptError)?;
        tag.copy_from_slice(sealed_tag.as_ref());
        Ok(record.len())
    }

    /// Opens `record`, a whole one as [`record_len`] measured it,
    /// in place, and acts on what it held if that is not data.
    pub(super) fn open(&mut self, record: &mut [u8]) -> Result<Opened, Error> {
        let (header, body) = record.split_at_mut(HEADER);
        let nonce = self.rx.next_nonce()?;
        let inner = self
            .rx
            .key
            .open_in_place(nonce, Aad::from(&header[..]), body)
            .map_err(|_| Error::DecryptError)?;
        // The type is the last byte that is not padding (§5.4).
        let Some(end) = inner.iter().rposition(|&byte| byte != 0) else {
            return Err(Error::InvalidMessage(InvalidMessage::InvalidContentType));
        };
        if end > DATA_MAX {
            return Err(Error::PeerSentOversizedRecord);
        }
        match inner[end] {
            APPLICATION_DATA => Ok(Opened::Data(HEADER..HEADER + end)),
            ALERT => alert(&inner[..end]),
            HANDSHAKE => self.handshake_messages(&inner[..end]),
            kind => Err(Error::InappropriateMessage {
                expect_types: vec![ContentType::ApplicationData],
                got_type: ContentType::from(kind),
            }),
        }
    }

    /// Acts on the handshake messages a record held: a KeyUpdate, which
    /// ends its record, or a session ticket for a client.
    fn handshake_messages(&mut self, mut messages: &[u8]) -> Result<Opened, Error> {
        if messages.is_empty() {
            return Err(Error::InvalidMessage(InvalidMessage::InvalidEmptyPayload));
        }
        while let [kind, a, b, c, rest @ ..] = messages {
            let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
            let Some((body, next)) = rest.split_at_checked(len) else {
                // Not joined across records: no peer of ours splits them.
                return Err(Error::InvalidMessage(InvalidMessage::MessageTooShort));
            };
            messages = next;
            match (*kind, body, &mut self.kernel) {
                (KEY_UPDATE, [asked @ (0 | 1)], _) => {
                    // A key changes only at a record's end (§5.1).
                    if !messages.is_empty() {
                        return Err(Error::InvalidMessage(InvalidMessage::TrailingData(
                            "KeyUpdate",
                        )));
                    }
                    self.rx = self.kernel.next_rx()?;
                    self.update_asked |= *asked == 1;
                }
                (KEY_UPDATE, ..) => {
                    return Err(Error::InvalidMessage(InvalidMessage::InvalidKeyUpdate));
                }
                (NEW_SESSION_TICKET, _, Kernel::Client(kernel)) => {
                    kernel.handle_new_session_ticket(body)?;
                }
                (kind, ..) => {
                    return Err(Error::InappropriateHandshakeMessage {
                        expect_types: vec![HandshakeType::KeyUpdate],
                        got_type: HandshakeType::from(kind),
                    });
                }
            }
        }
        if messages.is_empty() {
            Ok(Opened::Control)
        } else {
            Err(Error::InvalidMessage(InvalidMessage::MessageTooShort))
        }
    }
}

/// The length of the whole record at the front of `bytes`, once all of
/// it is there; an error if its header is not one a TLS 1.3 peer sends
/// after its handshake.
pub(super) fn record_len(bytes: &[u8]) -> Result<Option<usize>, Error> {
    let Some(header) = bytes.get(..HEADER) else {
        return Ok(None);
    };
    if header[0] != APPLICATION_DATA {
        return Err(Error::InappropriateMessage {
            expect_types: vec![ContentType::ApplicationData],
            got_type: ContentType::from(header[0]),
        });
    }
    let len = HEADER + usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > RECORD_MAX {
        return Err(Error::PeerSentOversizedRecord);
    }
    Ok((bytes.len() >= len).then_some(len))
}

/// What an alert means: close_notify ends the stream, any other fails it.
fn alert(content: &[u8]) -> Result<Opened, Error> {
    match *content {
        [_, 0] => Ok(Opened::Closed),
        [_, description] => Err(Error::AlertReceived(AlertDescription::from(description))),
        _ => Err(Error::InvalidMessage(InvalidMessage::MessageTooShort)),
    }
}

/// The alert that tells the peer why `err` ended the connection, if one
/// should: none answers the peer's own alert.
pub(super) fn alert_for(err: &Error) -> Option<AlertDescription> {
    Some(match err {
        Error::AlertReceived(_) => return None,
        Error::DecryptError => AlertDescription::BadRecordMac,
        Error::PeerSentOversizedRecord => AlertDescription::RecordOverflow,
        Error::InvalidMessage(_) => AlertDescription::DecodeError,
        Error::InappropriateMessage { .. } | Error::InappropriateHandshakeMessage { .. } => {
            AlertDescription::UnexpectedMessage
        }
        _ => AlertDescription::InternalError,
    })
}
