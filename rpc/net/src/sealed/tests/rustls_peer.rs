//! Tests with rustls itself as the peer: a blocking rustls connection on a
//! thread of its own, over a socket whose other end is ours.

use std::io::{Read, Write};

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

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
fn rustls_echo<C, S>(mut stream: rustls::StreamOwned<C, std::net::TcpStream>) -> io::Result<usize>
where
    C: std::ops::DerefMut + std::ops::Deref<Target = rustls::ConnectionCommon<S>>,
    S: rustls::SideData,
{
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
/// over `sealed` and checks each answer; then closes and reads the
/// peer's close_notify.
async fn echo_through(sealed: Sealed, lens: &[usize]) {
    let (mut read, mut write) = sealed.split(|err| err);
    for (i, &len) in lens.iter().enumerate() {
        let bytes: Vec<u8> = (0..len).map(|j| (i * 31 + j % 253) as u8).collect();
        let mut message = (len as u32).to_le_bytes().to_vec();
        message.extend_from_slice(&bytes);
        send(&mut write, &message, &[7, 20_000, 100_000]).await;
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
fn messages_echo_through_rustls_across_key_updates_as_a_client() {
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
        echo_through(sealed, &ECHO_LENS).await;
        assert_eq!(peer.join().unwrap().unwrap(), ECHO_LENS.len());
    })
    .unwrap();
}

#[test]
fn messages_echo_through_rustls_across_key_updates_as_a_server() {
    let [a, b, ..] = configurations();
    crate::net::block_on_local(async {
        let (ours, theirs) = socket_and_std_socket();
        let client = a.client();
        let peer = std::thread::spawn(move || {
            let conn = rustls::ClientConnection::new(client, Tls::server_name()).unwrap();
            rustls_echo(rustls::StreamOwned::new(conn, theirs))
        });
        let sealed = accept(b.server(), ours).await.unwrap();
        echo_through(sealed, &ECHO_LENS).await;
        assert_eq!(peer.join().unwrap().unwrap(), ECHO_LENS.len());
    })
    .unwrap();
}

/// rustls as a client on a thread of its own, which runs `peer` once its
/// handshake is done and the server said `go` (so that what it sends
/// next reaches a server whose handshake is over). Returns the server's
/// socket and the thread. Call inside a runtime.
fn rustls_client<T: Send + 'static>(
    tls: &Tls,
    peer: impl FnOnce(&mut rustls::ClientConnection, &mut std::net::TcpStream) -> io::Result<T>
    + Send
    + 'static,
) -> (TcpStream, std::thread::JoinHandle<io::Result<T>>) {
    let (ours, mut socket) = socket_and_std_socket();
    let config = tls.client();
    let thread = std::thread::spawn(move || {
        let mut conn =
            rustls::ClientConnection::new(config, Tls::server_name()).map_err(io::Error::other)?;
        let mut go = [0; 2];
        rustls::Stream::new(&mut conn, &mut socket).read_exact(&mut go)?;
        assert_eq!(&go, b"go");
        peer(&mut conn, &mut socket)
    });
    (ours, thread)
}

/// Our server's end of a connection accepted on `socket`, once it said
/// `go` to a [`rustls_client`]'s peer.
async fn accept_and_say_go(server: &Tls, socket: TcpStream) -> (ReadHalf, WriteHalf) {
    let sealed = accept(server.server(), socket).await.unwrap();
    let (read, mut write) = sealed.split(|err| err);
    write.write_all(b"go").await.unwrap();
    write.flush().await.unwrap();
    (read, write)
}

/// The records `conn` holds to send, as bytes.
fn records_of(conn: &mut rustls::ClientConnection) -> Vec<u8> {
    let mut bytes = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut bytes).unwrap();
    }
    bytes
}

/// Reads `socket` to its end into `conn`: the error rustls finds in what
/// the other end sent, if any.
fn told(
    conn: &mut rustls::ClientConnection,
    socket: &mut std::net::TcpStream,
) -> Option<rustls::Error> {
    loop {
        match conn.read_tls(socket) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if let Err(err) = conn.process_new_packets() {
            return Some(err);
        }
    }
}

#[test]
fn nothing_the_peer_sends_after_its_close_notify_is_read_and_a_write_then_fails() {
    let [a, b, ..] = configurations();
    crate::net::block_on_local(async {
        let (ours, peer) = rustls_client(&a, |conn, socket| {
            conn.writer().write_all(b"before")?;
            conn.send_close_notify();
            socket.write_all(&records_of(conn))?;
            // rustls seals data after its own close_notify when asked.
            conn.writer().write_all(b"after")?;
            let after = records_of(conn);
            socket.write_all(&after)?;
            Ok((after.len(), told(conn, socket)))
        });
        let (mut read, mut write) = accept_and_say_go(&b, ours).await;
        let (got, ended) = read_to_the_end(&mut read).await;
        assert_eq!(got, b"before");
        ended.expect("a close_notify is the stream's clean end");
        assert_eq!(read.read(&mut [0; 8]).await.unwrap(), 0, "and stays so");
        let refused = async {
            write.write_all(b"more").await?;
            write.flush().await
        };
        let err = refused.await.expect_err("the peer reads nothing more");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
        assert!(err.to_string().contains("close_notify"), "{err}");
        // This end may still end its side cleanly.
        write.shutdown().await.unwrap();
        drop((read, write));
        let (after, told) = peer.join().unwrap().unwrap();
        assert!(after > 0, "the data after the close_notify was sent");
        assert!(told.is_none(), "{told:?}");
    })
    .unwrap();
}

#[test]
fn a_flood_of_key_updates_from_the_peer_is_refused() {
    let [a, b, ..] = configurations();
    crate::net::block_on_local(async {
        let (ours, peer) = rustls_client(&a, |conn, socket| {
            conn.writer().write_all(b"data")?;
            // Each asks for one back; rustls allows 32 between data.
            for _ in 0..40 {
                conn.refresh_traffic_keys().map_err(io::Error::other)?;
            }
            socket.write_all(&records_of(conn))?;
            socket.shutdown(std::net::Shutdown::Write)?;
            told(conn, socket);
            Ok(())
        });
        let (mut read, write) = accept_and_say_go(&b, ours).await;
        let (got, ended) = read_to_the_end(&mut read).await;
        drop((read, write));
        assert_eq!(got, b"data");
        let err = ended.expect_err("the flood is refused");
        assert!(
            matches!(
                rustls_error(&err),
                rustls::Error::PeerMisbehaved(rustls::PeerMisbehaved::TooManyKeyUpdateRequests)
            ),
            "{err}"
        );
        peer.join().unwrap().unwrap();
    })
    .unwrap();
}

/// How a record rustls sealed is changed on its way.
#[derive(Debug, Clone)]
enum Tamper {
    /// One bit of the first record flipped.
    Flip { at: usize, bit: u8 },
    /// The first record sent twice.
    Replay,
    /// The second record sent before the first.
    Swap,
}

impl Tamper {
    /// The bytes sent for `records`, changed.
    fn apply(&self, records: &[Vec<u8>; 2]) -> Vec<u8> {
        match self {
            Tamper::Flip { at, bit } => {
                let mut record = records[0].clone();
                let at = at % record.len();
                record[at] ^= 1 << bit;
                record
            }
            Tamper::Replay => [&records[0][..], &records[0]].concat(),
            Tamper::Swap => [&records[1][..], &records[0]].concat(),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A record rustls sealed with any bit changed, sent again or out of
    /// order is refused: the reader gets what came before it and an
    /// error, no changed byte is read as data, and the sender is told
    /// with an alert (unless the change made the record longer than what
    /// came, which is a record cut short). A change to a header field
    /// that rustls does not authenticate leaves the record as it was.
    #[test]
    fn a_record_changed_replayed_or_reordered_is_refused(
        lens in (1usize..3_000, 1usize..3_000),
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
            let (data, changed) = ([first.clone(), second.clone()], tamper.clone());
            let (ours, peer) = rustls_client(&a, move |conn, socket| {
                let records = data.map(|data| {
                    conn.writer().write_all(&data).unwrap();
                    records_of(conn)
                });
                socket.write_all(&changed.apply(&records))?;
                socket.shutdown(std::net::Shutdown::Write)?;
                Ok(told(conn, socket))
            });
            let (mut read, write) = accept_and_say_go(&b, ours).await;
            let (got, ended) = read_to_the_end(&mut read).await;
            drop((read, write));
            (got, ended, peer.join().unwrap().unwrap())
        })
        .unwrap();
        // The first record: a 5-byte header, the data, its type, a tag.
        let record = lens.0 + RECORD_OVERHEAD;
        let expected: &[u8] = match tamper {
            Tamper::Replay => &first,
            // Header bits rustls does not authenticate (it builds the
            // additional data from constants): the outer type made
            // handshake or alert, the legacy version's low byte, which
            // TLS 1.3 ignores. The record opens as it was sealed.
            Tamper::Flip { at, bit } if (at % record == 0 && bit < 2) || at % record == 2 => {
                &first
            }
            _ => &[],
        };
        prop_assert!(read == expected, "read {} bytes, expected {}", read.len(), expected.len());
        let err = ended.expect_err("a changed record ends the stream with an error");
        if err.kind() != io::ErrorKind::UnexpectedEof {
            rustls_error(&err);
            prop_assert!(matches!(told, Some(rustls::Error::AlertReceived(_))), "{err}: told {told:?}");
        }
    }
}
