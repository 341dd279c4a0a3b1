//! Mutual TLS on every link (docs/protocol.md §11): a TLS folder holds the
//! cluster's certificate authority (`ca.pem`), its revocation list
//! (`crl.pem`) and one process's certificate and key (`cert.pem`,
//! `key.pem`). [`Tls::load`] reads one ([`Tls::load_files`] the same files
//! named one by one); the crate `bitfold-certs` (the command line's, not a
//! client's) writes them, as `bitfold certs` and `bitfold up --tls` do.
//!
//! Both ends of a link present a certificate and check the other's against
//! the CA and its revocation list. Every certificate names its holder's
//! [`Role`] in a SAN URI; a server's also carries the name [`SERVER_NAME`],
//! which a client checks rather than the address it dialled, so a folder
//! works whatever address its process listens on. What a role may call is
//! the servers' to decide; this module says who the peer is ([`Identity`]).
//!
//! A server re-reads its folder every [`RELOAD_INTERVAL`] ([`Tls::watch`]):
//! a new revocation list, certificate or key is used from the next
//! handshake on, and [`Tls::is_revoked`] sees the list at once.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
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

    /// Its name with the indefinite article: `a slave`, `an admin`.
    pub fn with_article(self) -> String {
        let article = if self.name().starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        format!("{article} {}", self.name())
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

/// How often a server re-reads its TLS folder ([`Tls::watch`]).
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Why TLS files could not be read or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error(
        "cannot read {}: {cause} (a TLS folder holds {CA_FILE}, {CERT_FILE}, {KEY_FILE} and \
         {CRL_FILE}; `bitfold certs issue` or `bitfold up --tls` writes one)",
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
        /// What was wrong (part of the message, not a `source()`).
        cause: String,
    },
}

/// The files of one process's TLS configuration (in a cluster file, its
/// `[tls]` table).
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
    /// The CA's revocation list; while the file is missing, nothing is revoked.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub crl: Option<PathBuf>,
}

impl Files {
    /// The files of the TLS folder `dir`.
    pub fn in_folder(dir: &Path) -> Files {
        Files {
            ca: dir.join(CA_FILE),
            cert: dir.join(CERT_FILE),
            key: dir.join(KEY_FILE),
            crl: Some(dir.join(CRL_FILE)),
        }
    }

    /// The files as found from `folder` (a relative path is relative to
    /// it, an absolute one stays as it is).
    pub fn relative_to(&self, folder: &Path) -> Files {
        Files {
            ca: folder.join(&self.ca),
            cert: folder.join(&self.cert),
            key: folder.join(&self.key),
            crl: self.crl.as_ref().map(|crl| folder.join(crl)),
        }
    }
}

/// Who holds a certificate, as the certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its common name: the process or client it was issued to.
    pub name: String,
    /// What its holder is.
    pub role: Role,
    /// Its serial number, without leading zero bytes.
    pub serial: Vec<u8>,
    /// The end of its validity.
    pub not_after: SystemTime,
}

impl Identity {
    /// Reads a certificate's holder: its one role URI, common name, serial
    /// and expiry.
    pub fn of(cert: &CertificateDer<'_>) -> Result<Identity, String> {
        let (_, cert) = x509_parser::parse_x509_certificate(cert.as_ref())
            .map_err(|e| format!("it is not a readable X.509 certificate ({e})"))?;
        let name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_owned();
        let uris: Vec<&str> = match cert.subject_alternative_name() {
            Ok(Some(names)) => names
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    x509_parser::extensions::GeneralName::URI(uri) => Some(*uri),
                    _ => None,
                })
                .filter(|uri| uri.starts_with(ROLE_URI))
                .collect(),
            Ok(None) => Vec::new(),
            Err(e) => return Err(format!("its names cannot be read ({e})")),
        };
        let role = match uris[..] {
            [uri] => Role::of_uri(uri).ok_or_else(|| {
                format!("its role {uri} is none of master, slave, admin and reader")
            })?,
            [] => {
                return Err(format!(
                    "the certificate of {name:?} names no role (a SAN URI {ROLE_URI}ROLE): it was \
                     made before roles; issue a new one with `bitfold certs issue`"
                ));
            }
            _ => {
                return Err(format!(
                    "the certificate of {name:?} names more than one role"
                ));
            }
        };
        let seconds = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0);
        Ok(Identity {
            name,
            role,
            serial: serial(cert.raw_serial()),
            not_after: SystemTime::UNIX_EPOCH + Duration::from_secs(seconds),
        })
    }

    /// The end of its validity in Unix seconds, as the wire carries it.
    pub fn not_after_seconds(&self) -> i64 {
        self.not_after
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }

    /// How long until it expires (zero once it has).
    pub fn expires_in(&self) -> Duration {
        self.not_after
            .duration_since(SystemTime::now())
            .unwrap_or_default()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the {} certificate {:?}", self.role, self.name)
    }
}

/// A serial number as compared: without the zero bytes DER may lead with.
fn serial(raw: &[u8]) -> Vec<u8> {
    let zeros = raw.iter().take_while(|&&b| b == 0).count();
    raw[zeros..].to_vec()
}

/// One process's TLS configuration, both as a server and as a client, as
/// last read from its files; cheap to clone (clones share reloads).
#[derive(Clone)]
pub struct Tls {
    files: Files,
    loaded: Arc<RwLock<Arc<Loaded>>>,
}

/// What the files said when they were last read.
struct Loaded {
    /// The files' bytes, to tell whether a reload changes anything.
    read: Read,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    own: Identity,
    /// Serials the revocation list names.
    revoked: HashSet<Vec<u8>>,
}

/// The bytes of a TLS configuration's files.
#[derive(PartialEq, Eq)]
struct Read {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
    /// None while the list's file is missing.
    crl: Option<Vec<u8>>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

impl Tls {
    /// Reads the TLS folder `dir`: `ca.pem`, `cert.pem`, `key.pem` and, if
    /// there is one, `crl.pem`.
    pub fn load(dir: &Path) -> Result<Tls, TlsError> {
        Tls::load_files(&Files::in_folder(dir))
    }

    /// Reads a CA, a certificate and its key (and a revocation list),
    /// wherever they are.
    pub fn load_files(files: &Files) -> Result<Tls, TlsError> {
        let loaded = Loaded::new(files, Read::of(files)?)?;
        Ok(Tls {
            files: files.clone(),
            loaded: Arc::new(RwLock::new(Arc::new(loaded))),
        })
    }

    /// Reads the files again; true if they changed (and are used from now
    /// on). Files that fail to load leave the configuration as it was.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let read = Read::of(&self.files)?;
        if self.current().read == read {
            return Ok(false);
        }
        let loaded = Arc::new(Loaded::new(&self.files, read)?);
        *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = loaded;
        Ok(true)
    }

    /// Re-reads the files every [`RELOAD_INTERVAL`], forever, logging each
    /// change and (once per cause) files that do not load.
    pub async fn watch(self) {
        let mut failing = None;
        loop {
            tokio::time::sleep(RELOAD_INTERVAL).await;
            match self.reload() {
                Ok(changed) => {
                    if changed {
                        let loaded = self.current();
                        tracing::info!(
                            "reloaded the TLS files of {}: {} revoked",
                            loaded.own,
                            loaded.revoked.len()
                        );
                    }
                    failing = None;
                }
                Err(err) => {
                    let text = err.to_string();
                    if failing.as_ref() != Some(&text) {
                        tracing::warn!("kept the TLS files loaded before: {text}");
                        failing = Some(text);
                    }
                }
            }
        }
    }

    fn current(&self) -> Arc<Loaded> {
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The CA file it trusts.
    pub fn ca(&self) -> &Path {
        &self.files.ca
    }

    /// Its own certificate's file.
    pub fn cert(&self) -> &Path {
        &self.files.cert
    }

    /// Who its own certificate says this process is.
    pub fn identity(&self) -> Identity {
        self.current().own.clone()
    }

    /// When its own certificate expires, in Unix seconds; 0 without TLS.
    pub fn not_after_seconds(tls: Option<&Tls>) -> i64 {
        tls.map_or(0, |tls| tls.current().own.not_after_seconds())
    }

    /// Whether the revocation list last read names `identity`'s certificate.
    pub fn is_revoked(&self, identity: &Identity) -> bool {
        self.current().revoked.contains(&identity.serial)
    }

    /// Its configuration as a server, as last read.
    pub(crate) fn server(&self) -> Arc<ServerConfig> {
        self.current().server.clone()
    }

    /// Its configuration as a client, as last read.
    pub(crate) fn client(&self) -> Arc<ClientConfig> {
        self.current().client.clone()
    }

    /// The name a client checks in the server's certificate.
    pub(crate) fn server_name() -> ServerName<'static> {
        ServerName::try_from(SERVER_NAME).expect("SERVER_NAME is a valid DNS name")
    }
}

impl Read {
    fn of(files: &Files) -> Result<Read, TlsError> {
        let read = |path: &Path| {
            fs::read(path).map_err(|e| TlsError::Read {
                path: path.to_owned(),
                cause: crate::describe_io(&e),
            })
        };
        let crl = match &files.crl {
            Some(path) => match fs::read(path) {
                Ok(bytes) => Some(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    return Err(TlsError::Read {
                        path: path.clone(),
                        cause: crate::describe_io(&e),
                    });
                }
            },
            None => None,
        };
        Ok(Read {
            ca: read(&files.ca)?,
            cert: read(&files.cert)?,
            key: read(&files.key)?,
            crl,
        })
    }
}

impl Loaded {
    fn new(files: &Files, read: Read) -> Result<Loaded, TlsError> {
        let pem_error = |path: &Path, cause: String| TlsError::Read {
            path: path.to_owned(),
            cause,
        };
        let unusable = |cause: String| TlsError::Unusable {
            files: Box::new(files.clone()),
            cause,
        };
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&read.ca) {
            let ca = ca.map_err(|e| pem_error(&files.ca, e.to_string()))?;
            roots.add(ca).map_err(|e| unusable(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(pem_error(&files.ca, "it holds no certificate".into()));
        }
        let chain = CertificateDer::pem_slice_iter(&read.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(&files.cert, e.to_string()))?;
        let Some(own) = chain.first() else {
            return Err(pem_error(&files.cert, "it holds no certificate".into()));
        };
        let own = Identity::of(own).map_err(|cause| pem_error(&files.cert, cause))?;
        let key = PrivateKeyDer::from_pem_slice(&read.key)
            .map_err(|e| pem_error(&files.key, e.to_string()))?;
        let (crls, revoked) = match (&files.crl, &read.crl) {
            (Some(path), Some(bytes)) => {
                revocations(bytes).map_err(|cause| pem_error(path, cause))?
            }
            _ => (Vec::new(), HashSet::new()),
        };

        let provider = Arc::new(provider());
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .with_crls(crls.clone())
            .only_check_end_entity_revocation()
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
        let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .with_crls(crls)
            .only_check_end_entity_revocation()
            .build()
            .map_err(|e| unusable(e.to_string()))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| unusable(e.to_string()))?
            .with_webpki_verifier(verifier)
            .with_client_auth_cert(chain, key)
            .map_err(|e| unusable(e.to_string()))?;
        Ok(Loaded {
            read,
            server: Arc::new(server),
            client: Arc::new(client),
            own,
            revoked,
        })
    }
}

/// The lists in a `crl.pem`, and the serials they revoke.
type Revocations = (Vec<CertificateRevocationListDer<'static>>, HashSet<Vec<u8>>);

/// Reads the revocation lists of a `crl.pem`.
fn revocations(pem: &[u8]) -> Result<Revocations, String> {
    let crls = CertificateRevocationListDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut revoked = HashSet::new();
    for crl in &crls {
        let (_, list) = x509_parser::parse_x509_crl(crl.as_ref())
            .map_err(|e| format!("it is not a readable revocation list ({e})"))?;
        revoked.extend(
            list.iter_revoked_certificates()
                .map(|cert| serial(cert.raw_serial())),
        );
    }
    Ok((crls, revoked))
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
    use bitfold_certs::cluster_set;

    use super::*;

    #[test]
    fn generated_folders_load_and_a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        cluster_set(dir.path(), &["s0"]).unwrap();
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
        cluster_set(dir.path(), &["a", "b"]).unwrap();
        let a = Tls::load(&dir.path().join("a")).unwrap();
        let b = Tls::load(&dir.path().join("b")).unwrap();
        let aes_128 = CipherSuite::TLS13_AES_128_GCM_SHA256;
        assert_eq!(negotiated(a.client(), b.server()), aes_128);

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
        assert_eq!(negotiated(Arc::new(other), b.server()), aes_128);
    }

    #[test]
    fn a_key_that_does_not_match_the_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        cluster_set(dir.path(), &["a", "b"]).unwrap();
        fs::copy(dir.path().join("b/key.pem"), dir.path().join("a/key.pem")).unwrap();
        let err = Tls::load(&dir.path().join("a")).unwrap_err();
        assert!(matches!(err, TlsError::Unusable { .. }), "{err}");
    }
}
