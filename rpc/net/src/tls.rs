//! Mutual TLS on every link (docs/protocol.md §11): a TLS folder holds the
//! cluster's certificate authority (`ca.pem`) and one process's certificate
//! and key (`cert.pem`, `key.pem`). [`Tls::load`] reads one ([`Tls::load_files`]
//! the same files named one by one); the crate `bitfold-certs` (the command
//! line's, not a client's) writes them, as `bitfold up --tls` does.
//!
//! Both ends of a link present a certificate and check the other's against
//! the CA: a server refuses a client without one, a client refuses a server
//! whose certificate the CA did not sign. Every certificate carries the name
//! [`SERVER_NAME`] and a client checks that name, not the address it dialled,
//! so a folder works whatever address its process listens on.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{CipherSuite, ClientConfig, RootCertStore, ServerConfig};

/// The name every certificate of a cluster carries and every client checks.
pub const SERVER_NAME: &str = "bitfold";

/// The CA's certificate in a TLS folder.
pub const CA_FILE: &str = "ca.pem";
/// The process's certificate in a TLS folder.
pub const CERT_FILE: &str = "cert.pem";
/// The process's private key in a TLS folder.
pub const KEY_FILE: &str = "key.pem";
/// The CA's certificate revocation list in a TLS folder (and in the CA's).
pub const CRL_FILE: &str = "crl.pem";

/// How a certificate names its holder's role: a SAN URI `bitfold://role/ROLE`.
pub const ROLE_URI: &str = "bitfold://role/";

/// What a certificate's holder is, and so what it may call
/// (docs/protocol.md §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The master: dials slaves, serves the DBMS interface.
    Master,
    /// A slave: serves the slave interface, dials other slaves.
    Slave,
    /// A client that may change the index (import, clear, delete,
    /// rebalance) as well as read it.
    Admin,
    /// A client that may only read the index (query, placement, status).
    Reader,
}

impl Role {
    /// Every role, servers' first.
    pub const ALL: [Role; 4] = [Role::Master, Role::Slave, Role::Admin, Role::Reader];

    /// Its name: `master`, `slave`, `admin` or `reader`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Master => "master",
            Role::Slave => "slave",
            Role::Admin => "admin",
            Role::Reader => "reader",
        }
    }

    /// The role named `name`, if any.
    pub fn named(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.name() == name)
    }

    /// The SAN URI a certificate of this role carries: `bitfold://role/NAME`.
    pub fn uri(self) -> String {
        format!("{ROLE_URI}{}", self.name())
    }

    /// The role a SAN URI names, if it is one of [`Role::uri`]'s.
    pub fn of_uri(uri: &str) -> Option<Role> {
        uri.strip_prefix(ROLE_URI).and_then(Role::named)
    }

    /// Whether its certificate serves (master, slave) as well as dials:
    /// only those carry the server name and the serverAuth usage.
    pub fn is_node(self) -> bool {
        matches!(self, Role::Master | Role::Slave)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why TLS files could not be read or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error(
        "cannot read {}: {cause} (a TLS folder holds {CA_FILE}, {CERT_FILE} and {KEY_FILE}; \
         `bitfold up --tls` writes them)",
        path.display()
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error (part of the message, not a `source()`).
        cause: String,
    },
    /// The certificate, key or CA do not make a usable configuration.
    #[error(
        "the certificate {}, its key {} and the CA {} are not usable together: {cause}",
        files.cert.display(),
        files.key.display(),
        files.ca.display()
    )]
    Unusable {
        /// The files.
        files: Box<Files>,
        /// What rustls said (part of the message, not a `source()`).
        cause: String,
    },
}

/// The three files of one process's TLS configuration (in a cluster file,
/// its `[tls]` table).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Files {
    /// The cluster's certificate authority.
    pub ca: PathBuf,
    /// The process's certificate, signed by `ca`.
    pub cert: PathBuf,
    /// The process's private key.
    pub key: PathBuf,
}

impl Files {
    /// The files of the TLS folder `dir`.
    pub fn in_folder(dir: &Path) -> Files {
        Files {
            ca: dir.join(CA_FILE),
            cert: dir.join(CERT_FILE),
            key: dir.join(KEY_FILE),
        }
    }

    /// The files as found from `folder` (a relative path is relative to
    /// it, an absolute one stays as it is).
    pub fn relative_to(&self, folder: &Path) -> Files {
        Files {
            ca: folder.join(&self.ca),
            cert: folder.join(&self.cert),
            key: folder.join(&self.key),
        }
    }
}

/// One process's TLS configuration, both as a server and as a client; cheap to clone.
#[derive(Clone)]
pub struct Tls {
    ca: PathBuf,
    pub(crate) server: Arc<ServerConfig>,
    pub(crate) client: Arc<ClientConfig>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("ca", &self.ca).finish()
    }
}

impl Tls {
    /// Reads the TLS folder `dir`: `dir/ca.pem`, `dir/cert.pem` and `dir/key.pem`.
    pub fn load(dir: &Path) -> Result<Tls, TlsError> {
        Tls::load_files(&Files::in_folder(dir))
    }

    /// Reads a CA, a certificate and its key, wherever they are.
    pub fn load_files(files: &Files) -> Result<Tls, TlsError> {
        let read = |path: &Path| {
            fs::read(path).map_err(|e| TlsError::Read {
                path: path.to_owned(),
                cause: crate::describe_io(&e),
            })
        };
        let pem_error = |path: &Path, cause: String| TlsError::Read {
            path: path.to_owned(),
            cause,
        };
        let unusable = |cause: String| TlsError::Unusable {
            files: Box::new(files.clone()),
            cause,
        };
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&read(&files.ca)?) {
            let ca = ca.map_err(|e| pem_error(&files.ca, e.to_string()))?;
            roots.add(ca).map_err(|e| unusable(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(pem_error(&files.ca, "it holds no certificate".into()));
        }
        let chain = CertificateDer::pem_slice_iter(&read(&files.cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(&files.cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(pem_error(&files.cert, "it holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?)
            .map_err(|e| pem_error(&files.key, e.to_string()))?;

        let provider = Arc::new(provider());
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| unusable(e.to_string()))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| unusable(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| unusable(e.to_string()))?;
        // A DBMS's TLS library may prefer AES-256; the server's order wins.
        server.ignore_client_order = true;
        // No link resumes a session, so no tickets.
        server.send_tls13_tickets = 0;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| unusable(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| unusable(e.to_string()))?;
        Ok(Tls {
            ca: files.ca.clone(),
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// The CA file it trusts.
    pub fn ca(&self) -> &Path {
        &self.ca
    }

    /// The name a client checks in the server's certificate.
    pub(crate) fn server_name() -> ServerName<'static> {
        ServerName::try_from(SERVER_NAME).expect("SERVER_NAME is a valid DNS name")
    }
}

/// The cryptography of every link: *ring*'s TLS 1.3 cipher suites with
/// AES-128-GCM first. Every byte between processes is encrypted once and
/// decrypted once, and AES-128 does 10 rounds a block to AES-256's 14.
fn provider() -> CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != CipherSuite::TLS13_AES_128_GCM_SHA256);
    provider
}

#[cfg(test)]
mod tests {
    use bitfold_certs::generate;

    use super::*;

    #[test]
    fn generated_folders_load_and_a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path(), &["master", "s0"]).unwrap();
        let tls = Tls::load(&dir.path().join("s0")).unwrap();
        assert_eq!(tls.ca(), dir.path().join("s0").join(CA_FILE));

        fs::remove_file(dir.path().join("master").join(KEY_FILE)).unwrap();
        let err = Tls::load(&dir.path().join("master"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("key.pem"), "{err}");
        assert!(err.contains("bitfold up --tls"), "{err}");
    }

    /// The suite a handshake between `client` and `server` settles on.
    fn negotiated(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> CipherSuite {
        let mut client = rustls::ClientConnection::new(client, Tls::server_name()).unwrap();
        let mut server = rustls::ServerConnection::new(server).unwrap();
        let mut bytes = Vec::new();
        while client.is_handshaking() || server.is_handshaking() {
            bytes.clear();
            client.write_tls(&mut bytes).unwrap();
            server.read_tls(&mut &bytes[..]).unwrap();
            server.process_new_packets().unwrap();
            bytes.clear();
            server.write_tls(&mut bytes).unwrap();
            client.read_tls(&mut &bytes[..]).unwrap();
            client.process_new_packets().unwrap();
        }
        let suite = client.negotiated_cipher_suite().unwrap().suite();
        assert_eq!(
            Some(suite),
            server.negotiated_cipher_suite().map(|s| s.suite())
        );
        suite
    }

    #[test]
    fn links_run_aes_128_gcm_even_with_a_client_that_prefers_aes_256() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path(), &["a", "b"]).unwrap();
        let a = Tls::load(&dir.path().join("a")).unwrap();
        let b = Tls::load(&dir.path().join("b")).unwrap();
        let aes_128 = CipherSuite::TLS13_AES_128_GCM_SHA256;
        assert_eq!(negotiated(a.client.clone(), b.server.clone()), aes_128);

        // rustls's own order (AES-256 first), as another TLS library may have.
        let files = Files::in_folder(&dir.path().join("a"));
        let mut roots = RootCertStore::empty();
        let ca = CertificateDer::from_pem_file(&files.ca).unwrap();
        roots.add(ca).unwrap();
        let chain = vec![CertificateDer::from_pem_file(&files.cert).unwrap()];
        let key = PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let default = rustls::crypto::ring::default_provider();
        assert_ne!(default.cipher_suites[0].suite(), aes_128);
        let other = ClientConfig::builder_with_provider(Arc::new(default))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap();
        assert_eq!(negotiated(Arc::new(other), b.server.clone()), aes_128);
    }

    #[test]
    fn a_key_that_does_not_match_the_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path(), &["a", "b"]).unwrap();
        fs::copy(dir.path().join("b/key.pem"), dir.path().join("a/key.pem")).unwrap();
        let err = Tls::load(&dir.path().join("a")).unwrap_err();
        assert!(matches!(err, TlsError::Unusable { .. }), "{err}");
    }
}
