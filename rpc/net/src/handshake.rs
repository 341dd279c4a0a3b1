//! The server's end of a TLS handshake, as every listener of a process runs
//! it (docs/protocol.md §11): within [`HANDSHAKE_TIMEOUT`], the client must
//! present a certificate the cluster's CA signed and did not revoke, naming
//! a role. The Cap'n Proto listener ([`crate::accept_loop`]) and the metrics
//! endpoint ([`accept_tls`]) both accept through it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::sealed::{self, ReadHalf, Sealed, WriteHalf};
use crate::tls::{Identity, Tls};
use crate::{End, HANDSHAKE_TIMEOUT, handshake_error, handshake_failure, peer_identity, seconds};

/// Runs the server's end of a handshake on `stream` with `tls` as it is
/// now: the connection and who the client is, or why it was refused.
pub(crate) async fn accept(tls: &Tls, stream: TcpStream) -> Result<(Sealed, Identity), String> {
    let handshake = sealed::accept(tls.server(), stream);
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => return Err(handshake_failure(&err, End::Server, None)),
        Err(_) => {
            return Err(format!(
                "no TLS handshake within {}",
                seconds(HANDSHAKE_TIMEOUT)
            ));
        }
    };
    let identity = peer_identity(&stream)?;
    Ok((stream, identity))
}

/// A TLS connection [`accept_tls`] accepted, for a protocol other than
/// Cap'n Proto: what is read and written is its data.
pub struct TlsStream {
    reader: ReadHalf,
    writer: WriteHalf,
}

/// Accepts a TLS client on `stream` as a Cap'n Proto listener with `tls`
/// does (a client certificate of the cluster's CA, not revoked, naming any
/// role, within 10 s): the connection and who the client is. A refusal is an
/// error that [`crate::is_handshake_failure`] recognises, saying why.
pub async fn accept_tls(tls: &Tls, stream: TcpStream) -> io::Result<(TlsStream, Identity)> {
    let (stream, identity) = accept(tls, stream).await.map_err(handshake_error)?;
    let (reader, writer) = stream.split(|err| err);
    Ok((TlsStream { reader, writer }, identity))
}

impl AsyncRead for TlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.writer).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::tls::Role;

    /// What [`accept_tls`] with the server `server` makes of a client that
    /// runs `client` on its socket: the client's identity and what it sent
    /// (the server answers `pong` and closes), or the server's error.
    async fn accepted<F, Fut>(server: &Tls, client: F) -> Result<(Identity, Vec<u8>), String>
    where
        F: FnOnce(TcpStream) -> Fut + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dialled = TcpStream::connect(addr).await.unwrap();
        let client = tokio::task::spawn_local(client(dialled));
        let (socket, _) = listener.accept().await.unwrap();
        let outcome = match accept_tls(server, socket).await {
            Ok((mut stream, identity)) => {
                let mut sent = vec![0; 4];
                stream.read_exact(&mut sent).await.unwrap();
                stream.write_all(b"pong").await.unwrap();
                stream.shutdown().await.unwrap();
                Ok((identity, sent))
            }
            Err(err) => {
                assert!(crate::is_handshake_failure(&err), "{err}");
                Err(err.to_string())
            }
        };
        client.await.unwrap();
        outcome
    }

    /// A client that presents `tls`'s certificate, sends `ping` and reads
    /// `pong` back if its handshake succeeds.
    fn pinging(tls: Tls) -> impl FnOnce(TcpStream) -> std::pin::Pin<Box<dyn Future<Output = ()>>> {
        move |socket| {
            Box::pin(async move {
                let name = Tls::server_name();
                let Ok(stream) = sealed::connect(tls.client(), name, socket).await else {
                    return;
                };
                let (mut reader, mut writer) = stream.split(|err| err);
                if writer.write_all(b"ping").await.is_ok() && writer.flush().await.is_ok() {
                    let mut answer = Vec::new();
                    if reader.read_to_end(&mut answer).await.is_ok() {
                        assert_eq!(answer, b"pong");
                    }
                }
            })
        }
    }

    /// The TLS folders of a cluster with one slave, `s0`, under `dir`.
    fn cluster(dir: &Path) -> (Tls, Tls) {
        bitfold_certs::cluster_set(dir, &["s0"]).unwrap();
        let load = |name: &str| Tls::load(&dir.join(name)).unwrap();
        (load("s0"), load("reader"))
    }

    #[test]
    fn a_client_of_the_cluster_ca_is_accepted_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let (server, reader) = cluster(dir.path());
        let (identity, sent) = crate::block_on_local(accepted(&server, pinging(reader)))
            .unwrap()
            .unwrap();
        assert_eq!(
            (identity.role, identity.name.as_str()),
            (Role::Reader, "reader")
        );
        assert_eq!(sent, b"ping");
    }

    #[test]
    fn plain_http_no_certificate_and_a_revoked_one_are_refused_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let (server, reader) = cluster(dir.path());
        let plain = |mut socket: TcpStream| async move {
            let _ = socket.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await;
            let _ = socket.read_to_end(&mut Vec::new()).await;
        };
        let err = crate::block_on_local(accepted(&server, plain))
            .unwrap()
            .unwrap_err();
        assert!(err.contains("the client does not speak TLS"), "{err}");

        // Trusts the CA, presents nothing.
        let ca = CertificateDer::from_pem_file(dir.path().join("reader/ca.pem")).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut anonymous = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        anonymous.enable_secret_extraction = true;
        let anonymous = Arc::new(anonymous);
        let without = move |socket: TcpStream| async move {
            let _ = sealed::connect(anonymous, Tls::server_name(), socket).await;
        };
        let err = crate::block_on_local(accepted(&server, without))
            .unwrap()
            .unwrap_err();
        assert!(err.contains("the client presented no certificate"), "{err}");

        let mut ca = bitfold_certs::Authority::open(&dir.path().join("ca")).unwrap();
        ca.revoke("reader").unwrap();
        assert!(server.reload().unwrap(), "the revocation list changed");
        let err = crate::block_on_local(accepted(&server, pinging(reader)))
            .unwrap()
            .unwrap_err();
        assert!(err.contains("Revoked"), "{err}");
    }
}
