//! A cluster's certificate authority and the certificates it signs, written
//! as the TLS folders bitfold's processes read ([`bitfold_net::tls`]): each
//! folder holds the CA's certificate (`ca.pem`) and one process's
//! certificate and key (`cert.pem`, `key.pem`).
//!
//! [`generate`] makes a new CA for a set of processes, as `bitfold up --tls`
//! does. The CA's key lives only while it signs them: it is not kept, so a
//! process added later needs the whole set generated again.
//!
//! Every certificate carries the name [`SERVER_NAME`] (which every client
//! checks), `localhost` and 127.0.0.1, and is valid both as a server's and
//! as a client's, since every process is both.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::fs;
use std::path::{Path, PathBuf};

use bitfold_net::tls::{CA_FILE, CERT_FILE, KEY_FILE, SERVER_NAME};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rcgen could not make a key or a certificate.
    #[error("cannot make {what}: {cause}")]
    Make {
        /// `the cluster CA`, or `the certificate of NAME`.
        what: String,
        /// What rcgen said (part of the message, not a `source()`).
        cause: String,
    },
    /// A file could not be written.
    #[error("cannot write {}: {cause}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error (part of the message, not a `source()`).
        cause: std::io::Error,
    },
}

/// Writes a new certificate authority to `dir/ca.pem` and, for each of
/// `names`, a TLS folder `dir/NAME` holding a copy of it and a certificate
/// and key it signed for the process `NAME`.
pub fn generate(dir: &Path, names: &[&str]) -> Result<(), Error> {
    let authority = Authority::new()?;
    write(&dir.join(CA_FILE), &authority.pem)?;
    for name in names {
        authority.issue(name, &dir.join(name))?;
    }
    Ok(())
}

/// A certificate authority: its certificate, and the key that signs with it.
struct Authority {
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, in PEM.
    pem: String,
}

impl Authority {
    /// A new CA, named `bitfold cluster CA`.
    fn new() -> Result<Authority, Error> {
        let failed = |e: rcgen::Error| Error::Make {
            what: "the cluster CA".to_owned(),
            cause: e.to_string(),
        };
        let key = KeyPair::generate().map_err(failed)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "bitfold cluster CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let pem = params.self_signed(&key).map_err(failed)?.pem();
        Ok(Authority {
            issuer: Issuer::new(params, key),
            pem,
        })
    }

    /// Signs a new certificate for the process `name` and writes the TLS
    /// folder `folder`: this CA's certificate, the new one and its key.
    fn issue(&self, name: &str, folder: &Path) -> Result<(), Error> {
        let failed = |e: rcgen::Error| Error::Make {
            what: format!("the certificate of {name}"),
            cause: e.to_string(),
        };
        let key = KeyPair::generate().map_err(failed)?;
        let mut params =
            CertificateParams::new(vec![SERVER_NAME.to_owned(), "localhost".to_owned()])
                .map_err(failed)?;
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params.distinguished_name.push(DnType::CommonName, name);
        // Strict verifiers (OpenSSL's X509_STRICT) want the issuer named by key.
        params.use_authority_key_identifier_extension = true;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;
        write(&folder.join(CA_FILE), &self.pem)?;
        write(&folder.join(CERT_FILE), &cert.pem())?;
        write_private(&folder.join(KEY_FILE), &key.serialize_pem())
    }
}

/// Writes `text` to `path`, creating its folder.
fn write(path: &Path, text: &str) -> Result<(), Error> {
    let written = match path.parent() {
        Some(parent) => fs::create_dir_all(parent).and_then(|()| fs::write(path, text)),
        None => fs::write(path, text),
    };
    written.map_err(|cause| Error::Write {
        path: path.to_owned(),
        cause,
    })
}

/// Writes a key readable by its owner only.
fn write_private(path: &Path, text: &str) -> Result<(), Error> {
    write(path, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(|cause| {
            Error::Write {
                path: path.to_owned(),
                cause,
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bitfold_net::tls::Tls;

    use super::*;

    #[test]
    fn every_folder_loads_and_shares_the_authority() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path(), &["master", "s0", "client"]).unwrap();
        let ca = fs::read_to_string(dir.path().join(CA_FILE)).unwrap();
        for name in ["master", "s0", "client"] {
            let folder = dir.path().join(name);
            Tls::load(&folder).unwrap();
            assert_eq!(fs::read_to_string(folder.join(CA_FILE)).unwrap(), ca);
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = fs::metadata(folder.join(KEY_FILE))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o600, "{name}'s key");
            }
        }
    }

    #[test]
    fn a_folder_that_cannot_be_written_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        fs::write(&file, "").unwrap();
        let err = generate(&file, &["s0"]).unwrap_err().to_string();
        assert!(err.starts_with("cannot write "), "{err}");
        assert!(err.contains("a-file"), "{err}");
    }
}
