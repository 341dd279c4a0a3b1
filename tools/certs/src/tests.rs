//! The CA folder and TLS folders as files (modes, contents read back with
//! x509-parser), and the certificates and list as rustls's verifiers take them.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bitfold_net::tls::{CA_FILE, CRL_FILE, KEY_FILE, ROLE_URI, Tls};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{CertificateError, RootCertStore};
use x509_parser::extensions::GeneralName;

use super::*;

const DAY: Duration = Duration::from_secs(86_400);

/// The permission bits of `path`.
fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// What a certificate file says of itself: its SAN URIs, DNS names, IPs,
/// whether it may serve and dial, its serial in hex, its CommonName.
#[derive(Debug, PartialEq)]
struct Read {
    uris: Vec<String>,
    dns: Vec<String>,
    ips: usize,
    server_auth: bool,
    client_auth: bool,
    serial: String,
    name: String,
    has_authority_key_id: bool,
}

fn read(path: &Path) -> Read {
    read_certificate(&fs::read_to_string(path).unwrap(), |cert| {
        let (mut uris, mut dns, mut ips) = (Vec::new(), Vec::new(), 0);
        for name in &cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
        {
            match name {
                GeneralName::URI(uri) => uris.push(uri.to_string()),
                GeneralName::DNSName(name) => dns.push(name.to_string()),
                GeneralName::IPAddress(_) => ips += 1,
                other => panic!("an unexpected name {other:?}"),
            }
        }
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        let cn = cert.subject().iter_common_name().next().unwrap();
        Read {
            uris,
            dns,
            ips,
            server_auth: eku.server_auth,
            client_auth: eku.client_auth,
            serial: authority::hex(cert.raw_serial()),
            name: cn.as_str().unwrap().to_owned(),
            has_authority_key_id: cert
                .iter_extensions()
                .any(|e| e.oid == x509_parser::oid_registry::OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER),
        }
    })
    .unwrap()
}

/// The serials a CRL file lists, and its CRL number.
fn crl(path: &Path) -> (Vec<String>, u64) {
    let text = fs::read(path).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&text).unwrap();
    let (_, crl) = x509_parser::parse_x509_crl(&pem.contents).unwrap();
    let serials = crl
        .iter_revoked_certificates()
        .map(|r| authority::hex(r.raw_serial()))
        .collect();
    let number = crl.crl_number().unwrap().to_u64_digits();
    (serials, number.first().copied().unwrap_or(0))
}

/// A new CA in `dir/ca`, valid `days`.
fn new_ca(dir: &Path, days: u32) -> Authority {
    Authority::init(&dir.join("ca"), days).unwrap()
}

#[test]
fn the_ca_key_and_every_key_are_the_owners_alone_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = new_ca(dir.path(), 30);
    assert_eq!(mode(&dir.path().join("ca")), 0o700);
    assert_eq!(mode(&dir.path().join("ca").join(CA_KEY_FILE)), 0o600);
    for file in [CA_FILE, CRL_FILE, INDEX_FILE] {
        assert!(dir.path().join("ca").join(file).is_file(), "{file}");
    }
    let out = dir.path().join("deep/s0");
    ca.issue(Role::Slave, "s0", 10, &out).unwrap();
    assert_eq!(mode(&out), 0o700);
    assert_eq!(mode(&out.join(KEY_FILE)), 0o600);
    Tls::load(&out).unwrap();

    // Issued again over a folder and key others could read: both narrowed.
    fs::set_permissions(&out, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(out.join(KEY_FILE), fs::Permissions::from_mode(0o644)).unwrap();
    ca.issue(Role::Slave, "s0", 10, &out).unwrap();
    assert_eq!((mode(&out), mode(&out.join(KEY_FILE))), (0o700, 0o600));
    assert_eq!(
        fs::read_dir(&out).unwrap().count(),
        4,
        "ca, cert, key, crl and nothing else"
    );
}

#[test]
fn each_role_names_itself_once_and_only_nodes_may_serve() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = new_ca(dir.path(), 30);
    for role in Role::ALL {
        let out = dir.path().join(role.name());
        let issued = ca.issue(role, &format!("the {role}"), 5, &out).unwrap();
        let cert = read(&out.join(CERT_FILE));
        assert_eq!(cert.uris, [format!("{ROLE_URI}{role}")], "{role}");
        assert_eq!(cert.name, format!("the {role}"));
        assert_eq!(cert.serial, issued.serial);
        assert_eq!(cert.serial.len(), 32, "16 bytes");
        assert!(cert.has_authority_key_id, "{role}");
        assert!(cert.client_auth, "{role}");
        if role.is_node() {
            assert!(cert.server_auth, "{role}");
            assert_eq!(cert.dns, ["bitfold", "localhost"]);
            assert_eq!(cert.ips, 1);
        } else {
            // A client certificate cannot serve: no name to serve under, no serverAuth.
            assert!(!cert.server_auth, "{role}");
            assert!(cert.dns.is_empty() && cert.ips == 0, "{role}: {cert:?}");
        }
    }
}

/// rustls's verifiers, as a bitfold process would build them from the TLS
/// folder `folder` (its CA and its CRL).
fn verifiers(folder: &Path) -> (Arc<dyn ClientCertVerifier>, Arc<WebPkiServerVerifier>) {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(folder.join(CA_FILE)).unwrap())
        .unwrap();
    let roots = Arc::new(roots);
    let crls = vec![CertificateRevocationListDer::from_pem_file(folder.join(CRL_FILE)).unwrap()];
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .with_crls(crls.clone())
        .build()
        .unwrap();
    let servers = WebPkiServerVerifier::builder_with_provider(roots, provider)
        .with_crls(crls)
        .build()
        .unwrap();
    (clients, servers)
}

/// What a server (`as_server`) or a client makes of the certificate in `folder`.
fn verdict(verifiers: &Path, folder: &Path, as_server: bool) -> Result<(), rustls::Error> {
    let (clients, servers) = self::verifiers(verifiers);
    let cert = CertificateDer::from_pem_file(folder.join(CERT_FILE)).unwrap();
    let now = UnixTime::now();
    if as_server {
        let name = ServerName::try_from(bitfold_net::tls::SERVER_NAME).unwrap();
        servers
            .verify_server_cert(&cert, &[], &name, &[], now)
            .map(|_| ())
    } else {
        clients.verify_client_cert(&cert, &[], now).map(|_| ())
    }
}

#[test]
fn rustls_takes_nodes_as_servers_clients_only_as_clients_and_refuses_the_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let set = dir.path().join("tls");
    cluster_set(&set, &["s0"]).unwrap();
    let (master, admin) = (set.join(MASTER), set.join(ADMIN));
    assert_eq!(verdict(&master, &set.join("s0"), true), Ok(()));
    assert_eq!(verdict(&master, &set.join("s0"), false), Ok(()));
    assert_eq!(verdict(&master, &admin, false), Ok(()));
    assert!(
        matches!(
            verdict(&master, &admin, true),
            Err(rustls::Error::InvalidCertificate(_))
        ),
        "a client certificate cannot serve"
    );

    let mut ca = Authority::open(&set.join(CLUSTER_CA)).unwrap();
    ca.revoke(ADMIN).unwrap();
    // The master's folder got the new list, so its verifier refuses the admin.
    assert_eq!(
        verdict(&master, &admin, false),
        Err(rustls::Error::InvalidCertificate(CertificateError::Revoked))
    );
    assert_eq!(verdict(&master, &set.join(READER), false), Ok(()));

    // A certificate that has expired is refused too.
    let now = SystemTime::now();
    let old = dir.path().join("old");
    ca.issue_between(Role::Reader, "old", now - 10 * DAY, now - DAY, &old)
        .unwrap();
    assert!(verdict(&master, &old, false).is_err());
}

#[test]
fn revoking_lists_every_serial_of_the_name_and_refreshes_the_copies_here() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = new_ca(dir.path(), 30);
    let ca_crl = dir.path().join("ca").join(CRL_FILE);
    assert_eq!(crl(&ca_crl), (vec![], 1), "an empty list from the start");
    let first = ca
        .issue(Role::Admin, "ops", 5, &dir.path().join("ops-1"))
        .unwrap();
    // A renewal: another certificate of the name, another line.
    let second = ca
        .issue(Role::Admin, "ops", 5, &dir.path().join("ops-2"))
        .unwrap();
    ca.issue(Role::Slave, "s0", 5, &dir.path().join("s0"))
        .unwrap();
    ca.issue(Role::Slave, "s1", 5, &dir.path().join("s1"))
        .unwrap();
    ca.issue(Role::Slave, "s2", 5, &dir.path().join("s2"))
        .unwrap();
    assert_eq!(ca.issued().len(), 5);
    // s1's folder went, s2's now holds another CA's files.
    fs::remove_dir_all(dir.path().join("s1")).unwrap();
    let other = dir.path().join("other");
    cluster_set(&other, &[]).unwrap();
    fs::copy(
        other.join("admin").join(CA_FILE),
        dir.path().join("s2").join(CA_FILE),
    )
    .unwrap();

    let revocation = ca.revoke("ops").unwrap();
    assert_eq!(revocation.newly, 2);
    assert_eq!(
        revocation
            .revoked
            .iter()
            .map(|i| &i.serial)
            .collect::<Vec<_>>(),
        [&first.serial, &second.serial]
    );
    let (serials, number) = crl(&ca_crl);
    assert_eq!(serials, [first.serial.clone(), second.serial.clone()]);
    assert_eq!(number, 2);
    let mut refreshed = revocation.refreshed.clone();
    refreshed.sort();
    let folder = |name: &str| files::absolute(&dir.path().join(name));
    assert_eq!(refreshed, [folder("ops-1"), folder("ops-2"), folder("s0")]);
    for name in ["ops-1", "ops-2", "s0"] {
        assert_eq!(
            fs::read(dir.path().join(name).join(CRL_FILE)).unwrap(),
            fs::read(&ca_crl).unwrap(),
            "{name}"
        );
    }
    let skipped: Vec<_> = revocation.skipped.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(skipped, [dir.path().join("s1"), folder("s2")]);
    assert_ne!(
        fs::read(dir.path().join("s2").join(CRL_FILE)).unwrap(),
        fs::read(&ca_crl).unwrap()
    );

    // Again: nothing new, the list stays as it was.
    assert_eq!(ca.revoke("ops").unwrap().newly, 0);
    assert_eq!(crl(&ca_crl).1, 2);
    // A new certificate of the name is valid, and revoked in its turn.
    let third = ca
        .issue(Role::Admin, "ops", 5, &dir.path().join("ops-3"))
        .unwrap();
    ca.revoke("ops").unwrap();
    assert_eq!(
        crl(&ca_crl),
        (vec![first.serial, second.serial, third.serial], 3)
    );

    let err = ca.revoke("nobody").unwrap_err().to_string();
    assert!(err.contains("no certificate named nobody"), "{err}");
    assert!(err.contains("`bitfold certs list --ca "), "{err}");
}

#[test]
fn each_certificate_is_valid_expired_or_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = new_ca(dir.path(), 30);
    let now = SystemTime::now();
    ca.issue(Role::Slave, "s0", 5, &dir.path().join("s0"))
        .unwrap();
    ca.issue_between(
        Role::Reader,
        "late",
        now - 3 * DAY,
        now - DAY,
        &dir.path().join("late"),
    )
    .unwrap();
    ca.issue(Role::Admin, "gone", 5, &dir.path().join("gone"))
        .unwrap();
    ca.revoke("gone").unwrap();
    // The index read back says the same.
    let ca = Authority::open(&dir.path().join("ca")).unwrap();
    let states: Vec<_> = ca
        .issued()
        .iter()
        .map(|i| (i.name.as_str(), i.role, i.state(SystemTime::now())))
        .collect();
    assert_eq!(
        states,
        [
            ("s0", Role::Slave, State::Valid),
            ("late", Role::Reader, State::Expired),
            ("gone", Role::Admin, State::Revoked)
        ]
    );
    assert_eq!(
        [State::Valid, State::Expired, State::Revoked].map(|s| s.to_string()),
        ["valid", "expired", "revoked"]
    );
}

#[test]
fn validity_defaults_to_a_year_for_nodes_and_90_days_for_clients_within_the_ca() {
    assert_eq!(Role::ALL.map(default_days), [365, 365, 90, 90]);
    let dir = tempfile::tempdir().unwrap();
    let mut ca = new_ca(dir.path(), 100);
    let days_left = |t: SystemTime| t.duration_since(SystemTime::now()).unwrap().as_secs() / 86_400;
    assert_eq!(days_left(ca.not_after()), 99, "99 days and some hours");
    let issued = ca
        .issue(Role::Admin, "a", 90, &dir.path().join("a"))
        .unwrap();
    assert_eq!(days_left(issued.not_after), 89);
    assert!(issued.not_before < SystemTime::now());

    let err = ca
        .issue(Role::Slave, "s0", 365, &dir.path().join("s0"))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "outlive the CA in {}",
            dir.path().join("ca").display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("valid until {}", utc(ca.not_after()))),
        "{text}"
    );
    assert!(text.contains("at most 99 days"), "{text}");
    assert!(!dir.path().join("s0").exists(), "nothing written");
    let err = ca
        .issue(Role::Slave, "s0", 0, &dir.path().join("s0"))
        .unwrap_err();
    assert!(matches!(err, Error::Days { days: 0 }), "{err}");
    assert!(matches!(
        Authority::init(&dir.path().join("forever"), u32::MAX),
        Err(Error::Days { .. })
    ));
    assert_eq!(ca.issued().len(), 1);
}

#[test]
fn a_ca_folder_is_made_once_and_opened_after() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let err = Authority::open(&ca_dir).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "no CA in {0}: `bitfold certs init --ca {0}` makes one",
            ca_dir.display()
        )
    );
    let made = Authority::init(&ca_dir, 30).unwrap();
    let err = Authority::init(&ca_dir, 30).unwrap_err();
    assert!(matches!(err, Error::CaExists { .. }), "{err}");
    let opened = Authority::open(&ca_dir).unwrap();
    assert_eq!(opened.certificate_pem(), made.certificate_pem());
    assert_eq!(opened.not_after(), made.not_after());

    // A name keeps its role while it holds a valid certificate.
    let mut ca = opened;
    ca.issue(Role::Reader, "bi", 5, &dir.path().join("bi"))
        .unwrap();
    let err = ca
        .issue(Role::Admin, "bi", 5, &dir.path().join("bi"))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OtherRole {
                role: Role::Reader,
                ..
            }
        ),
        "{err}"
    );
    for bad in ["", "a\nb", &"x".repeat(65)] {
        let err = ca
            .issue(Role::Reader, bad, 5, &dir.path().join("bad"))
            .unwrap_err();
        assert!(matches!(err, Error::BadName { .. }), "{err}");
    }
    // A lost list is made again from the index.
    fs::remove_file(ca_dir.join(CRL_FILE)).unwrap();
    Authority::open(&ca_dir).unwrap();
    assert_eq!(crl(&ca_dir.join(CRL_FILE)), (vec![], 1));
}

#[test]
fn a_cluster_set_has_its_ca_a_folder_per_process_and_two_clients() {
    let dir = tempfile::tempdir().unwrap();
    let set = dir.path().join("tls");
    let made = cluster_set(&set, &["s0", "s1"]).unwrap();
    assert!(made.new_ca);
    let names: Vec<_> = made
        .issued
        .iter()
        .map(|i| (i.name.as_str(), i.role))
        .collect();
    assert_eq!(
        names,
        [
            ("master", Role::Master),
            ("s0", Role::Slave),
            ("s1", Role::Slave),
            ("admin", Role::Admin),
            ("reader", Role::Reader)
        ]
    );
    let ca = fs::read_to_string(set.join(CLUSTER_CA).join(CA_FILE)).unwrap();
    for name in ["master", "s0", "s1", "admin", "reader"] {
        let folder = set.join(name);
        Tls::load(&folder).unwrap();
        assert_eq!(fs::read_to_string(folder.join(CA_FILE)).unwrap(), ca);
        assert_eq!(
            (mode(&folder), mode(&folder.join(KEY_FILE))),
            (0o700, 0o600)
        );
    }
    assert_eq!(mode(&set.join(CLUSTER_CA).join(CA_KEY_FILE)), 0o600);

    // The cluster grew: only the new slave's folder is issued, by the kept CA.
    let grown = cluster_set(&set, &["s0", "s1", "s2"]).unwrap();
    assert!(!grown.new_ca);
    assert_eq!(grown.issued.len(), 1);
    assert_eq!(
        (grown.issued[0].name.as_str(), grown.issued[0].role),
        ("s2", Role::Slave)
    );
    assert_eq!(
        fs::read_to_string(set.join("s2").join(CA_FILE)).unwrap(),
        ca
    );
    assert!(
        cluster_set(&set, &["s0", "s1", "s2"])
            .unwrap()
            .issued
            .is_empty()
    );

    let err = cluster_set(&set, &["admin"]).unwrap_err();
    assert!(matches!(err, Error::BadName { .. }), "{err}");
}

#[test]
fn the_set_of_an_earlier_bitfold_is_named_with_the_way_on() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("tls");
    for folder in ["master", "s0", "client"] {
        fs::create_dir_all(old.join(folder)).unwrap();
    }
    fs::write(old.join(CA_FILE), "").unwrap();
    let err = cluster_set(&old, &["s0"]).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "{} holds TLS folders of an earlier bitfold",
            old.display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("remove {} to have a new set made", old.display())),
        "{err}"
    );
    // An empty folder is no old set.
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    assert!(cluster_set(&empty, &[]).unwrap().new_ca);
}

#[test]
fn a_folder_that_cannot_be_written_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    fs::write(&file, "").unwrap();
    let err = Authority::init(&file.join("ca"), 5)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("cannot write "), "{err}");
    assert!(err.contains("a-file"), "{err}");
}
