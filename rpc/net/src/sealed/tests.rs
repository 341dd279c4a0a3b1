//! The TLS connection's tests with both ends ours; [`rustls_peer`]'s have
//! rustls itself at the other end.

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::tls::{self, Tls};
use bitfold_certs::cluster_set;

mod rustls_peer;

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
    /// data, nothing panics or hangs. A socket that ends without a
    /// close_notify, even right after a whole record, is an error too:
    /// the stream may have been cut there.
    #[test]
    fn after_the_handshake_only_sealed_bytes_are_read(
        len in 0usize..100_000,
        // Nothing at all, often: the socket's bare end.
        unsealed in prop_oneof![Just(Vec::new()), unsealed_bytes()],
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
        let err = ended.expect_err("a socket's end without close_notify is not the stream's end");
        if sent == 0 {
            prop_assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
            prop_assert!(err.to_string().contains("without a TLS close_notify"), "{}", err);
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

/// A client's last words, then the end of its socket: after its
/// close_notify if `cleanly`, else bare. Returns the server's read half,
/// what it read and how its stream ended.
async fn last_words(cleanly: bool) -> (ReadHalf, Vec<u8>, io::Result<()>) {
    let [a, b, ..] = configurations();
    let (client, server) = handshakes(&a, &b).await;
    let (client_read, mut client_write) = client.unwrap().split(|err| err);
    let (mut server_read, _server_write) = server.unwrap().split(|err| err);
    client_write.write_all(b"last words").await.unwrap();
    if cleanly {
        client_write.shutdown().await.unwrap();
    } else {
        // The socket ends after a whole record, with no close_notify: as
        // if the stream were cut there.
        client_write.flush().await.unwrap();
        drop(client_read);
        let shared = Rc::into_inner(client_write.0).expect("both halves are here");
        shared.sealed.into_inner().socket.shutdown().await.unwrap();
    }
    let (got, ended) = read_to_the_end(&mut server_read).await;
    (server_read, got, ended)
}

#[test]
fn a_shutdown_ends_the_peers_stream_after_what_was_written() {
    crate::net::block_on_local(async {
        let (mut read, got, ended) = last_words(true).await;
        assert_eq!(got, b"last words");
        ended.expect("a close_notify, then the socket's end, is the stream's end");
        assert_eq!(read.read(&mut [0; 8]).await.unwrap(), 0);
    })
    .unwrap();
}

#[test]
fn a_socket_that_ends_without_close_notify_is_an_error_not_the_streams_end() {
    crate::net::block_on_local(async {
        let (mut read, got, ended) = last_words(false).await;
        assert_eq!(got, b"last words");
        let err = ended.expect_err("not the stream's end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        assert!(
            err.to_string().contains("without a TLS close_notify"),
            "{err}"
        );
        let again = read
            .read(&mut [0; 8])
            .await
            .expect_err("and stays an error");
        assert_eq!(again.to_string(), err.to_string());
    })
    .unwrap();
}

#[test]
fn each_end_sees_the_certificate_the_other_presented() {
    let dir = tempfile::tempdir().unwrap();
    cluster_set(dir.path(), &["a", "b"]).unwrap();
    let [a, b] = ["a", "b"].map(|name| Tls::load(&dir.path().join(name)).unwrap());
    let cert = |name: &str| {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_file(dir.path().join(name).join(tls::CERT_FILE)).unwrap()
    };
    assert_ne!(cert("a"), cert("b"));
    crate::net::block_on_local(async {
        let (client, server) = handshakes(&a, &b).await;
        let (client, server) = (client.unwrap(), server.unwrap());
        assert_eq!(client.peer_certificate(), Some(&cert("b")));
        assert_eq!(server.peer_certificate(), Some(&cert("a")));
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
