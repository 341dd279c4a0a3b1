//! A kept certificate authority: its folder, what it issues and revokes.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bitfold_net::tls::{CA_FILE, CERT_FILE, CRL_FILE, KEY_FILE, Role, SERVER_NAME};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevokedCertParams, SanType, SerialNumber,
};

use crate::files::{self, PRIVATE, PUBLIC, utc};
use crate::index::{Index, Issued};
use crate::{CA_KEY_FILE, Error, INDEX_FILE};

/// The CommonName of every cluster CA.
const CA_NAME: &str = "bitfold cluster CA";

/// How long before now a new certificate starts being valid, so that a
/// peer whose clock is a little behind accepts it.
const CLOCK_SLACK: Duration = Duration::from_secs(3600);

/// One day.
const DAY: Duration = Duration::from_secs(86_400);

/// A CA kept in a folder (its *CA folder*): `ca.pem`, its certificate;
/// `ca-key.pem`, its key (mode 0600); `crl.pem`, its certificate
/// revocation list; `issued.toml`, the index of what it issued. The folder
/// is 0700.
pub struct Authority {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, in PEM.
    pem: String,
    not_after: SystemTime,
    index: Index,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("dir", &self.dir)
            .field("not_after", &utc(self.not_after))
            .finish_non_exhaustive()
    }
}

/// What [`Authority::revoke`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// Every certificate of the name, now all revoked, oldest first.
    pub revoked: Vec<Issued>,
    /// How many of them this call revoked (the others already were).
    pub newly: usize,
    /// The TLS folders whose `crl.pem` was replaced by the new list.
    pub refreshed: Vec<PathBuf>,
    /// The folders the index lists that were not refreshed, and why.
    pub skipped: Vec<(PathBuf, &'static str)>,
}

impl Authority {
    /// Makes a new CA valid for `days` days from now in the folder `dir`
    /// (created, or narrowed, to mode 0700), with an empty CRL and index.
    /// A folder that already holds a CA is refused.
    pub fn init(dir: &Path, days: u32) -> Result<Authority, Error> {
        if [CA_FILE, CA_KEY_FILE, INDEX_FILE]
            .iter()
            .any(|file| dir.join(file).exists())
        {
            return Err(Error::CaExists {
                dir: dir.to_owned(),
            });
        }
        let now = SystemTime::now();
        let not_after = after_days(now, days)?;
        let failed = make_error("the CA");
        let key = KeyPair::generate().map_err(failed)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, CA_NAME);
        // It signs the certificates of processes, no other CA.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = (now - CLOCK_SLACK).into();
        params.not_after = not_after.into();
        params.serial_number = Some(random_serial()?);
        let pem = params.self_signed(&key).map_err(failed)?.pem();

        files::private_dir(dir)?;
        let key_path = dir.join(CA_KEY_FILE);
        files::create_new(&key_path, &key.serialize_pem(), PRIVATE).map_err(|cause| {
            if cause.kind() == std::io::ErrorKind::AlreadyExists {
                Error::CaExists {
                    dir: dir.to_owned(),
                }
            } else {
                files::write_error(&key_path)(cause)
            }
        })?;
        let authority = Authority {
            dir: dir.to_owned(),
            issuer: Issuer::new(params, key),
            pem,
            // What the certificate says (rcgen drops the fraction of a second).
            not_after: SystemTime::UNIX_EPOCH
                + Duration::from_secs(
                    not_after
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                ),
            index: Index {
                crl_number: 1,
                issued: Vec::new(),
            },
        };
        files::replace(&dir.join(CA_FILE), &authority.pem, PUBLIC)?;
        files::replace(&dir.join(CRL_FILE), &authority.crl(now)?, PUBLIC)?;
        authority.index.save(dir)?;
        Ok(authority)
    }

    /// Opens the CA kept in the folder `dir`.
    pub fn open(dir: &Path) -> Result<Authority, Error> {
        if !dir.join(CA_KEY_FILE).exists() {
            return Err(Error::NoCa {
                dir: dir.to_owned(),
            });
        }
        let ca_path = dir.join(CA_FILE);
        let pem = files::read(&ca_path)?;
        let key_path = dir.join(CA_KEY_FILE);
        let key = KeyPair::from_pem(&files::read(&key_path)?).map_err(|e| Error::Corrupt {
            path: key_path.clone(),
            cause: e.to_string(),
        })?;
        let corrupt = |cause: String| Error::Corrupt {
            path: ca_path.clone(),
            cause,
        };
        let not_after = crate::read_certificate(&pem, |cert| {
            SystemTime::UNIX_EPOCH
                + Duration::from_secs(cert.validity().not_after.timestamp().max(0).unsigned_abs())
        })
        .map_err(corrupt)?;
        let issuer = Issuer::from_ca_cert_pem(&pem, key).map_err(|e| corrupt(e.to_string()))?;
        let authority = Authority {
            dir: dir.to_owned(),
            issuer,
            pem,
            not_after,
            index: Index::load(dir)?,
        };
        // The list is always there: make it again if it went missing.
        if !dir.join(CRL_FILE).exists() {
            let crl = authority.crl(SystemTime::now())?;
            files::replace(&dir.join(CRL_FILE), &crl, PUBLIC)?;
        }
        Ok(authority)
    }

    /// Its folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// When its own certificate stops being valid: no certificate it
    /// issues may outlive it.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Its certificate, in PEM (what every TLS folder it wrote holds as `ca.pem`).
    pub fn certificate_pem(&self) -> &str {
        &self.pem
    }

    /// Every certificate it issued, oldest first.
    pub fn issued(&self) -> &[Issued] {
        &self.index.issued
    }

    /// Issues a certificate of `role` for `name`, valid for `days` days
    /// from now, and writes the TLS folder `out` ([`Authority::issue_between`]).
    pub fn issue(
        &mut self,
        role: Role,
        name: &str,
        days: u32,
        out: &Path,
    ) -> Result<Issued, Error> {
        let now = SystemTime::now();
        self.issue_between(role, name, now - CLOCK_SLACK, after_days(now, days)?, out)
    }

    /// Issues a certificate of `role` for `name`, valid from `not_before`
    /// to `not_after` (both to the second; so a test can make one that has
    /// expired), records it in the index and writes the TLS folder `out`
    /// (created or narrowed to mode 0700): `ca.pem`, `cert.pem`, `key.pem`
    /// (0600 from its creation) and `crl.pem` (a copy of the CA's), each
    /// replacing what was there at once.
    ///
    /// The certificate names its role by the SAN URI [`Role::uri`] and its
    /// holder by its CommonName. A node's (master, slave) also carries the
    /// DNS names [`SERVER_NAME`] and `localhost` and the IP 127.0.0.1, and
    /// may serve and dial (serverAuth and clientAuth); a client's (admin,
    /// reader) carries no DNS or IP name and may only dial (clientAuth).
    /// A name may hold several certificates (a renewal adds one), of one role.
    pub fn issue_between(
        &mut self,
        role: Role,
        name: &str,
        not_before: SystemTime,
        not_after: SystemTime,
        out: &Path,
    ) -> Result<Issued, Error> {
        check_name(name)?;
        let now = SystemTime::now();
        if let Some(other) = self
            .index
            .issued
            .iter()
            .find(|i| i.name == name && i.role != role && i.state(now) == crate::State::Valid)
        {
            return Err(Error::OtherRole {
                name: name.to_owned(),
                role: other.role,
                dir: self.dir.clone(),
            });
        }
        let (not_before, not_after) = (to_second(not_before), to_second(not_after));
        if not_after <= not_before {
            return Err(Error::Validity {
                not_before: utc(not_before),
                not_after: utc(not_after),
            });
        }
        if not_after > self.not_after {
            return Err(Error::OutlivesCa {
                dir: self.dir.clone(),
                not_after: utc(not_after),
                ca_not_after: utc(self.not_after),
                days: self
                    .not_after
                    .duration_since(SystemTime::now())
                    .map_or(0, |left| left.as_secs() / DAY.as_secs()),
            });
        }

        let what = format!("the certificate of {name}");
        let failed = make_error(&what);
        let key = KeyPair::generate().map_err(failed)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        let uri = role.uri().try_into().map_err(failed)?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if role.is_node() {
            for dns in [SERVER_NAME, "localhost"] {
                let dns = dns.try_into().map_err(failed)?;
                params.subject_alt_names.push(SanType::DnsName(dns));
            }
            params
                .subject_alt_names
                .push(SanType::IpAddress([127, 0, 0, 1].into()));
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
        }
        // Strict verifiers (OpenSSL's X509_STRICT) want the issuer named by key.
        params.use_authority_key_identifier_extension = true;
        let serial = random_serial()?;
        params.serial_number = Some(serial.clone());
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;

        let crl = files::read(&self.dir.join(CRL_FILE))?;
        files::private_dir(out)?;
        files::replace(&out.join(CA_FILE), &self.pem, PUBLIC)?;
        files::replace(&out.join(CRL_FILE), &crl, PUBLIC)?;
        files::replace(&out.join(CERT_FILE), &cert.pem(), PUBLIC)?;
        files::replace(&out.join(KEY_FILE), &key.serialize_pem(), PRIVATE)?;

        let issued = Issued {
            name: name.to_owned(),
            role,
            serial: hex(serial.as_ref()),
            not_before,
            not_after,
            folder: files::absolute(out),
            revoked: None,
        };
        self.index.issued.push(issued.clone());
        self.index.save(&self.dir)?;
        Ok(issued)
    }

    /// Revokes every certificate of `name`: marks them in the index, makes
    /// the CA's `crl.pem` again (every revoked serial, the next CRL number)
    /// and replaces `crl.pem`, at once, in each folder the index lists that
    /// still exists and holds this CA's `ca.pem`. Folders elsewhere (other
    /// machines) need a copy of the CA's `crl.pem`.
    pub fn revoke(&mut self, name: &str) -> Result<Revocation, Error> {
        let now = to_second(SystemTime::now());
        let mut newly = 0;
        for issued in self.index.issued.iter_mut().filter(|i| i.name == name) {
            if issued.revoked.is_none() {
                issued.revoked = Some(now);
                newly += 1;
            }
        }
        let revoked: Vec<Issued> = self
            .index
            .issued
            .iter()
            .filter(|i| i.name == name)
            .cloned()
            .collect();
        if revoked.is_empty() {
            return Err(Error::UnknownName {
                name: name.to_owned(),
                dir: self.dir.clone(),
            });
        }
        let crl_path = self.dir.join(CRL_FILE);
        if newly > 0 {
            self.index.crl_number += 1;
            let crl = self.crl(now)?;
            self.index.save(&self.dir)?;
            files::replace(&crl_path, &crl, PUBLIC)?;
        }
        let crl = files::read(&crl_path)?;
        let (mut refreshed, mut skipped) = (Vec::new(), Vec::new());
        let folders: BTreeSet<&PathBuf> = self.index.issued.iter().map(|i| &i.folder).collect();
        for folder in folders {
            match fs::read_to_string(folder.join(CA_FILE)) {
                Ok(ca) if ca == self.pem => {
                    files::replace(&folder.join(CRL_FILE), &crl, PUBLIC)?;
                    refreshed.push(folder.clone());
                }
                Ok(_) => skipped.push((folder.clone(), "its ca.pem is another CA's")),
                Err(_) => skipped.push((folder.clone(), "it has no ca.pem any more")),
            }
        }
        Ok(Revocation {
            revoked,
            newly,
            refreshed,
            skipped,
        })
    }

    /// The CA's CRL as of `now`, in PEM: the serial of every revoked
    /// certificate, valid until the CA itself is.
    fn crl(&self, now: SystemTime) -> Result<String, Error> {
        let failed = make_error("the certificate revocation list");
        let revoked_certs = self
            .index
            .issued
            .iter()
            .filter_map(|issued| Some((issued, issued.revoked?)))
            .map(|(issued, when)| {
                let serial = unhex(&issued.serial).ok_or_else(|| Error::Corrupt {
                    path: self.dir.join(INDEX_FILE),
                    cause: format!(
                        "the serial `{}` of {} is not hex",
                        issued.serial, issued.name
                    ),
                })?;
                Ok(RevokedCertParams {
                    serial_number: SerialNumber::from_slice(&serial),
                    revocation_time: when.into(),
                    reason_code: None,
                    invalidity_date: None,
                })
            })
            .collect::<Result<_, Error>>()?;
        let params = CertificateRevocationListParams {
            this_update: to_second(now).into(),
            // A list is good until the CA is; one made by an expired CA, a day.
            next_update: self.not_after.max(now + DAY).into(),
            crl_number: SerialNumber::from(self.index.crl_number),
            issuing_distribution_point: None,
            revoked_certs,
            // As the CA's own certificate names its key (rcgen's default).
            key_identifier_method: KeyIdMethod::Sha256,
        };
        params
            .signed_by(&self.issuer)
            .map_err(failed)?
            .pem()
            .map_err(failed)
    }
}

/// `now` plus `days` days, which must be at least 1.
fn after_days(now: SystemTime, days: u32) -> Result<SystemTime, Error> {
    // The last second of the year 9999, the last a certificate can hold.
    let last = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    now.checked_add(DAY * days)
        .filter(|t| days > 0 && *t <= last)
        .ok_or(Error::Days { days })
}

/// `t` without its fraction of a second, as a certificate holds it.
fn to_second(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// Refuses a name no certificate should carry.
fn check_name(name: &str) -> Result<(), Error> {
    let why = if name.trim().is_empty() {
        "it is empty"
    } else if name.chars().count() > 64 {
        "a CommonName has at most 64 characters"
    } else if name.chars().any(char::is_control) {
        "it holds a control character"
    } else {
        return Ok(());
    };
    Err(Error::BadName {
        name: name.to_owned(),
        why,
    })
}

/// The error of rcgen failing to make `what`.
fn make_error(what: &str) -> impl Fn(rcgen::Error) -> Error + Copy + '_ {
    move |e| Error::Make {
        what: what.to_owned(),
        cause: e.to_string(),
    }
}

/// A random serial number of 16 bytes, positive (its top bit clear) and
/// with a first byte that is not zero, so that it stays 16 bytes in DER.
fn random_serial() -> Result<SerialNumber, Error> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(|_| {
        Error::Make {
            what: "a serial number".to_owned(),
            cause: "the system's random numbers are not available".to_owned(),
        }
    })?;
    bytes[0] = (bytes[0] & 0x7f).max(1);
    Ok(SerialNumber::from_slice(&bytes))
}

/// `bytes` in lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `text` ([`hex`]) stands for.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
