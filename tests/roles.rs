//! Security by role (docs/protocol.md §11): a `bitfold up --tls` cluster
//! allows every method to exactly the roles the table says, refuses the
//! others with `forbidden` and changes nothing; refuses at the handshake a
//! client without a certificate, with an expired one, a revoked one or
//! another CA's; sees a revocation within 10 s without a restart, on open
//! connections too; and a slave cannot start with a client's certificate.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use bitfold_certs::Authority;
use bitfold_client::{Client, ErrorKind, Format};
use bitfold_engine::VectorBuf;
use bitfold_net::tls::{Role, Tls};
use bitfold_net::{self as net, Sent};
use bitfold_proto::bitfold_capnp::slave;

use crate::util::{Server, bitfold, free_port_block, stderr};

/// A `bitfold up --tls` cluster of two slaves: the process, its TLS folder
/// (`DIR/tls`) and the master's and slaves' addresses.
struct TlsCluster {
    _up: Server,
    tls: PathBuf,
    master: String,
    slaves: Vec<String>,
}

impl TlsCluster {
    fn start(dir: &Path) -> TlsCluster {
        let port = free_port_block();
        let args: Vec<String> = ["up", "--tls", "--slaves", "2", "--port", &port.to_string()]
            .iter()
            .map(|s| s.to_string())
            .chain(["--dir".to_owned(), dir.to_str().unwrap().to_owned()])
            .collect();
        let up = Server::start("master", &args).expect("up --tls starts");
        let slaves = (1..=2).map(|i| format!("127.0.0.1:{}", port + i)).collect();
        TlsCluster {
            master: up.addr.clone(),
            _up: up,
            tls: dir.join("tls"),
            slaves,
        }
    }

    /// A client of the master with the TLS folder `folder`.
    fn client(&self, folder: &Path) -> Client {
        let tls = Tls::load(folder).expect("the folder loads");
        Client::connect_tls(&self.master, &tls).expect("the client starts")
    }

    /// Whether vector `vid` does not exist, as an admin reads it.
    fn lacks(&self, vid: u64) -> bool {
        let admin = self.client(&self.tls.join("admin"));
        admin
            .query(&format!("P:{vid}"), Format::Count)
            .is_err_and(|e| e.kind() == Some(ErrorKind::NotFound))
    }

    /// Issues a certificate of `role` named `name` from the cluster's CA
    /// into a folder of `dir`.
    fn issue(&self, role: Role, name: &str, dir: &Path) -> PathBuf {
        let mut ca = Authority::open(&self.tls.join("ca")).unwrap();
        let folder = dir.join(name);
        ca.issue(role, name, 1, &folder).unwrap();
        folder
    }
}

/// Imports the bit `bit` into vector `vid` as `client`.
fn import(client: &Client, vid: u64, bit: u32) -> Result<(), bitfold_client::Error> {
    let vector = VectorBuf::from_bits(vec![bit]);
    client.import(&[(vid, vector.as_part())])
}

/// Clears the bit `bit` of vector `vid` as `client`.
fn clear(client: &Client, vid: u64, bit: u32) -> Result<u64, bitfold_client::Error> {
    let vector = VectorBuf::from_bits(vec![bit]);
    client.clear(&[(vid, vector.as_part())])
}

/// The answer to `query` as a count.
fn count(client: &Client, query: &str) -> u64 {
    match client.query(query, Format::Count) {
        Ok(bitfold_client::Answer::Count(n)) => n,
        other => panic!("{query}: a count, not {other:?}"),
    }
}

/// Whether a master method's outcome is the refusal the table says:
/// `forbidden`, naming the role it needs.
fn is_forbidden<T: std::fmt::Debug>(outcome: &Result<T, bitfold_client::Error>) -> bool {
    match outcome {
        Err(err) if err.kind() == Some(ErrorKind::Forbidden) => {
            assert!(err.to_string().starts_with("forbidden: "), "{err}");
            true
        }
        // `status` and `placement` have no error field: a failed call.
        Err(err) => err.to_string().contains("forbidden: "),
        Ok(_) => false,
    }
}

/// Calls every master method as `client`; true for each that was allowed,
/// in the order query, placement, status, import, clear, delete, rebalance.
fn master_methods(client: &Client, vid: u64) -> [(&'static str, bool); 7] {
    let allowed = |refused: bool| !refused;
    [
        (
            "query",
            allowed(is_forbidden(&client.query("R:1-3", Format::Count))),
        ),
        ("placement", allowed(is_forbidden(&client.placement()))),
        ("status", allowed(is_forbidden(&client.status()))),
        ("import", allowed(is_forbidden(&import(client, vid, 7)))),
        ("clear", allowed(is_forbidden(&clear(client, 1, 1)))),
        (
            "delete",
            allowed(is_forbidden(&client.delete(&[(vid + 1, vid + 1)]))),
        ),
        ("rebalance", allowed(is_forbidden(&client.rebalance(1)))),
    ]
}

/// Calls every slave method of the slave at `addr` with empty arguments,
/// over TLS with `folder`; for each, whether it was refused as forbidden.
fn slave_methods(addr: &str, folder: &Path) -> Vec<(&'static str, bool)> {
    let tls = Tls::load(folder).unwrap();
    net::block_on_local(async move {
        let connection =
            net::connect::<slave::Client>(addr, Sent::default(), Some(&tls), Role::Slave)
                .await
                .expect("the slave accepts the handshake");
        let s = &connection.client;
        let refused = |outcome: Result<(), capnp::Error>| {
            outcome.is_err_and(|e| e.to_string().contains("forbidden: "))
        };
        macro_rules! call {
            ($request:ident) => {
                refused(s.$request().send().promise.await.map(|_| ()))
            };
        }
        vec![
            ("health", call!(health_request)),
            ("catalog", call!(catalog_request)),
            ("fetch", call!(fetch_request)),
            ("fetchMany", call!(fetch_many_request)),
            ("gather", call!(gather_request)),
            ("handle", call!(handle_request)),
            ("coordinate", call!(coordinate_request)),
            ("import", call!(import_request)),
            ("update", call!(update_request)),
            ("commit", call!(commit_request)),
            ("pull", call!(pull_request)),
        ]
    })
    .unwrap()
}

/// What the cluster holds, as an admin reads it: the answer to a range
/// query over every vid imported, and each slave's vector count.
fn holdings(cluster: &TlsCluster) -> (u64, Vec<u64>) {
    let admin = cluster.client(&cluster.tls.join("admin"));
    let count = count(&admin, "R:0-1000000");
    let vectors = admin.status().unwrap().iter().map(|s| s.vectors).collect();
    (count, vectors)
}

#[test]
fn every_method_is_allowed_to_exactly_the_roles_of_the_table_and_a_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TlsCluster::start(&dir.path().join("cluster"));
    let admin = cluster.client(&cluster.tls.join("admin"));
    for vid in 1..=3 {
        import(&admin, vid, vid as u32).unwrap();
    }
    let folders = [
        (
            Role::Master,
            cluster.issue(Role::Master, "another-master", dir.path()),
        ),
        (
            Role::Slave,
            cluster.issue(Role::Slave, "another-slave", dir.path()),
        ),
        (Role::Reader, cluster.tls.join("reader")),
        (Role::Admin, cluster.tls.join("admin")),
    ];

    // Every role but admin first: none of them may change anything.
    let before = holdings(&cluster);
    for (i, (role, folder)) in folders.iter().enumerate() {
        let client = cluster.client(folder);
        for (method, allowed) in master_methods(&client, 100 + 10 * i as u64) {
            let reads = matches!(method, "query" | "placement" | "status");
            let expected = match role {
                Role::Admin => true,
                Role::Reader => reads,
                Role::Master | Role::Slave => false,
            };
            assert_eq!(allowed, expected, "Master.{method} by a {role}");
        }
        if *role != Role::Admin {
            assert_eq!(
                holdings(&cluster),
                before,
                "refused calls by a {role} changed nothing"
            );
        }
    }
    assert_eq!(
        count(&admin, "P:1"),
        0,
        "the admin's clear emptied vector 1"
    );
    assert_eq!(
        count(&admin, "P:130"),
        1,
        "the admin's import wrote vector 130"
    );

    for (role, folder) in &folders {
        let before = holdings(&cluster);
        for slave in &cluster.slaves {
            for (method, refused) in slave_methods(slave, folder) {
                assert_eq!(refused, !role.is_node(), "Slave.{method} by a {role}");
            }
        }
        if !role.is_node() {
            assert_eq!(
                holdings(&cluster),
                before,
                "refused calls by a {role} changed nothing"
            );
        }
    }
}

#[test]
fn the_command_line_prints_forbidden_naming_the_role_and_exits_7() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TlsCluster::start(&dir.path().join("cluster"));
    let pairs = dir.path().join("v.csv");
    std::fs::write(&pairs, "1,5\n").unwrap();
    let reader = cluster.tls.join("reader");
    let run = bitfold(&[
        "import",
        "--master",
        &cluster.master,
        "--tls",
        reader.to_str().unwrap(),
        pairs.to_str().unwrap(),
    ]);
    let printed = stderr(&run);
    assert_eq!(run.status.code(), Some(7), "{printed}");
    assert!(
        printed
            .starts_with("error: forbidden: `import` needs an admin certificate, and 127.0.0.1:")
            && printed.ends_with("called it with the reader certificate \"reader\"\n"),
        "{printed}"
    );
    let run = bitfold(&[
        "query",
        "--master",
        &cluster.master,
        "--tls",
        reader.to_str().unwrap(),
        "P:1",
    ]);
    // A reader may query: vector 1 was never imported.
    assert_eq!(run.status.code(), Some(4), "{}", stderr(&run));
}

/// Waits up to `within` for `refused()`; panics naming `what` if it never is.
fn wait_for(what: &str, within: Duration, refused: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < within {
        if refused() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what} was not refused within {within:?}");
}

#[test]
fn a_revoked_admin_is_refused_within_10_s_without_a_restart_on_open_and_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TlsCluster::start(&dir.path().join("cluster"));
    let ops = cluster.issue(Role::Admin, "ops", dir.path());
    let open = cluster.client(&ops);
    import(&open, 1, 1).unwrap();

    let mut ca = Authority::open(&cluster.tls.join("ca")).unwrap();
    let revocation = ca.revoke("ops").unwrap();
    assert!(
        revocation.refreshed.contains(&cluster.tls.join("master")),
        "the master's folder gets the new list: {revocation:?}"
    );
    let took = wait_for(
        "a call on the open connection",
        Duration::from_secs(10),
        || {
            open.query("P:1", Format::Count)
                .is_err_and(|e| e.kind() == Some(ErrorKind::Forbidden))
        },
    );
    eprintln!("the revocation took effect after {took:?}");
    let refused = import(&open, 2, 2).unwrap_err().to_string();
    assert!(refused.contains("has been revoked"), "{refused}");
    let fresh = Client::connect_tls(&cluster.master, &Tls::load(&ops).unwrap()).unwrap();
    let refused = fresh.query("P:1", Format::Count).unwrap_err().to_string();
    assert!(refused.contains("the TLS handshake failed"), "{refused}");
    assert!(cluster.lacks(2), "the refused import changed nothing");
}

#[test]
fn no_expired_revoked_or_foreign_certificate_and_no_certificate_gets_past_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TlsCluster::start(&dir.path().join("cluster"));
    let mut ca = Authority::open(&cluster.tls.join("ca")).unwrap();
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let expired = dir.path().join("expired");
    ca.issue_between(Role::Admin, "expired", now - 3 * day, now - day, &expired)
        .unwrap();
    let revoked = cluster.issue(Role::Admin, "revoked", dir.path());
    Authority::open(&cluster.tls.join("ca"))
        .unwrap()
        .revoke("revoked")
        .unwrap();
    let mut other = Authority::init(&dir.path().join("other-ca"), 30).unwrap();
    let foreign = dir.path().join("foreign");
    other.issue(Role::Admin, "foreign", 1, &foreign).unwrap();

    // Refused when it connects, or at its first call (here `call`).
    let refused_at =
        |folder: &Path, call: &dyn Fn(&Client) -> Result<(), bitfold_client::Error>| {
            let handshake = |err: bitfold_client::Error| {
                let err = err.to_string();
                err.contains("the TLS handshake failed") || err.contains("closed the connection")
            };
            match Client::connect_tls(&cluster.master, &Tls::load(folder).unwrap()) {
                Ok(client) => call(&client).is_err_and(handshake),
                Err(err) => handshake(err),
            }
        };
    let query = |client: &Client| client.query("P:1", Format::Count).map(|_| ());
    let refused = |folder: &Path| refused_at(folder, &query);
    // Another CA's certificate with our CA's: the master refuses it, not the client.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    for file in ["cert.pem", "key.pem"] {
        std::fs::copy(foreign.join(file), mixed.join(file)).unwrap();
    }
    std::fs::copy(cluster.tls.join("admin/ca.pem"), mixed.join("ca.pem")).unwrap();
    assert!(refused(&expired), "an expired certificate is refused");
    assert!(refused(&foreign), "another CA's certificate is refused");
    assert!(
        refused(&mixed),
        "a certificate another CA signed is refused by the master"
    );
    wait_for("a revoked certificate", Duration::from_secs(10), || {
        refused(&revoked)
    });
    for folder in [&expired, &foreign, &mixed, &revoked] {
        assert!(
            refused_at(folder, &|client| import(client, 9, 9)),
            "{}",
            folder.display()
        );
    }
    let plain = Client::connect(&cluster.master).unwrap();
    let err = import(&plain, 9, 9).unwrap_err().to_string();
    assert!(err.contains("--tls"), "{err}");
    assert!(cluster.lacks(9), "none of them changed anything");
}

#[test]
fn a_slave_cannot_start_with_a_readers_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TlsCluster::start(&dir.path().join("cluster"));
    let reader = cluster.tls.join("reader");
    let run = bitfold(&[
        "slave",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.path().join("s").to_str().unwrap(),
        "--tls",
        reader.to_str().unwrap(),
    ]);
    assert!(!run.status.success());
    let err = stderr(&run);
    assert!(
        err.contains("the reader certificate \"reader\", not a slave's"),
        "{err}"
    );
    assert!(err.contains("bitfold certs issue --role slave"), "{err}");
}

#[test]
fn status_warns_of_a_certificate_in_use_that_expires_within_14_days() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TlsCluster::start(&dir.path().join("cluster"));
    let status = |folder: &Path| {
        let run = bitfold(&[
            "status",
            "--master",
            &cluster.master,
            "--tls",
            folder.to_str().unwrap(),
        ]);
        assert!(run.status.success(), "{}", stderr(&run));
        crate::util::stdout(&run)
    };
    let fresh = status(&cluster.tls.join("reader"));
    assert!(!fresh.contains("warning:"), "{fresh}");
    let mut ca = Authority::open(&cluster.tls.join("ca")).unwrap();
    let soon = dir.path().join("soon");
    ca.issue(Role::Reader, "soon", 10, &soon).unwrap();
    let warned = status(&soon);
    let warning = warned
        .lines()
        .find(|line| line.starts_with("warning: the certificate of this client"))
        .unwrap_or_else(|| panic!("no warning for the client's certificate: {warned}"));
    assert!(warning.contains("expires in 9d23h"), "{warning}");
    assert!(warning.contains("bitfold certs issue"), "{warning}");
}
