//! Mutual TLS (docs/protocol.md §11): a `bitfold up --tls` cluster answers
//! TLS clients exactly, across slaves (so slave-to-slave links run TLS),
//! and refuses every peer without a certificate signed by its CA with one
//! clear line, on the client and in the server's log.

use std::fs;
use std::path::Path;

use bitfold_client::{Client, Format, LocalClient};
use bitfold_net::tls::{Files, Tls};
use bitfold_server::cluster::ClusterFile;

use crate::util::{
    Oracle, Rng, Server, assert_answer, assert_fails_with, bitfold, free_port_block, stderr, stdout,
};

/// A cluster of `bitfold up --tls` with three slaves, and its folder.
fn tls_cluster(dir: &Path) -> (Server, String) {
    let port = free_port_block();
    let args: Vec<String> = [
        "up",
        "--tls",
        "--dir",
        dir.to_str().unwrap(),
        "--port",
        &port.to_string(),
        "--slaves",
        "3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let up = Server::start("master", &args).expect("up --tls starts");
    let master = up.addr.clone();
    (up, master)
}

/// Imports `oracle`'s vectors through `bitfold import --tls TLS`, as a
/// pairs file written in `dir`.
fn import_over_tls(master: &str, tls: &Path, oracle: &Oracle, dir: &Path) {
    let pairs = dir.join("v.csv");
    oracle.write_pairs(&pairs);
    let run = bitfold(&[
        "import",
        "--master",
        master,
        "--tls",
        tls.to_str().unwrap(),
        pairs.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
}

#[test]
fn a_tls_cluster_answers_tls_clients_exactly_across_slaves() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, master) = tls_cluster(&dir.path().join("cluster"));
    let client_tls = dir.path().join("cluster/tls/admin");

    // Vectors of 2^23 bits are cut into 8 pieces, each placed on its own,
    // so on different slaves: a range query over them runs on several.
    let mut rng = Rng(11);
    let mut oracle = Oracle::default();
    for vid in (0..2000).step_by(97) {
        oracle.add(vid, (0..300).map(|_| rng.below(1 << 23) as u32));
    }
    import_over_tls(&master, &client_tls, &oracle, dir.path());

    let status = bitfold(&[
        "status",
        "--master",
        &master,
        "--tls",
        client_tls.to_str().unwrap(),
    ]);
    assert!(
        stdout(&status).contains("3 of 3 slaves up"),
        "{}",
        stdout(&status)
    );
    let holders = stdout(&status)
        .lines()
        .filter(|line| line.starts_with('s'))
        // `s0  ADDR  up for 3s  VECTORS ...`
        .filter(|line| line.split_whitespace().nth(5).is_some_and(|v| v != "0"))
        .count();
    assert!(
        holders >= 2,
        "the vectors should spread: {}",
        stdout(&status)
    );

    // `up --tls` names the master's files in the cluster file.
    let file = ClusterFile::load(&dir.path().join("cluster/cluster.toml")).unwrap();
    assert_eq!(file.tls, Some(Files::in_folder(Path::new("tls/master"))));

    let client = Client::connect_tls(&master, &Tls::load(&client_tls).unwrap()).unwrap();
    let local = LocalClient::connect_tls(&master, &Tls::load(&client_tls).unwrap()).unwrap();
    for terms in [
        vec![(0, 2000)],
        vec![(0, 1000), (500, 1999)],
        vec![(97, 97)],
    ] {
        let query = Oracle::range_query(&terms);
        assert_answer(&client, &query, &oracle.range(&terms));
        // A client run by this thread gets the same answers over TLS.
        for format in [Format::Count, Format::Roaring, Format::Words] {
            assert_eq!(
                local.query(&query, format).unwrap(),
                client.query(&query, format).unwrap(),
                "{query} as {format:?}"
            );
        }
    }
    // A reader's folder is enough to query.
    let reader_tls = dir.path().join("cluster/tls/reader");
    let point = bitfold(&[
        "query",
        "--master",
        &master,
        "--tls",
        reader_tls.to_str().unwrap(),
        "--output",
        "count",
        "P:194",
    ]);
    assert_eq!(
        stdout(&point),
        format!("{}\n", oracle.vectors[&194].len()),
        "{}",
        stderr(&point)
    );
}

#[test]
fn a_peer_without_a_certificate_of_the_cluster_ca_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster");
    let (up, master) = tls_cluster(&cluster);

    // A plain client, to the master and to a slave (every link is TLS).
    let plain = bitfold(&["query", "--master", &master, "R:0-9"]);
    assert_fails_with(
        &plain,
        5,
        &format!(
            "cannot reach the master at {master}: the master closed the connection without \
             answering (if it runs with --tls, pass --tls DIR)"
        ),
    );
    let slave = stdout(&bitfold(&[
        "status",
        "--master",
        &master,
        "--tls",
        cluster.join("tls/reader").to_str().unwrap(),
    ]))
    .lines()
    .find(|line| line.starts_with("s0 "))
    .and_then(|line| line.split_whitespace().nth(1).map(str::to_owned))
    .expect("status lists s0");
    let plain_to_slave = bitfold(&["status", "--master", &slave]);
    assert_eq!(
        plain_to_slave.status.code(),
        Some(5),
        "{}",
        stderr(&plain_to_slave)
    );

    // Another cluster's certificates: the client refuses the master's.
    let other = dir.path().join("other");
    bitfold_certs::cluster_set(&other, &[]).unwrap();
    let other_client = other.join("reader");
    let run = bitfold(&[
        "query",
        "--master",
        &master,
        "--tls",
        other_client.to_str().unwrap(),
        "R:0-9",
    ]);
    assert_fails_with(
        &run,
        5,
        &format!(
            "cannot reach the master at {master}: the TLS handshake failed: the server's \
             certificate is not signed by the CA in {}",
            other_client.join("ca.pem").display()
        ),
    );

    // Trusting the cluster's CA but holding another CA's certificate: the
    // master refuses the client.
    let mixed = dir.path().join("mixed");
    fs::create_dir(&mixed).unwrap();
    fs::copy(cluster.join("tls/ca/ca.pem"), mixed.join("ca.pem")).unwrap();
    for file in ["cert.pem", "key.pem"] {
        fs::copy(other_client.join(file), mixed.join(file)).unwrap();
    }
    let run = bitfold(&[
        "query",
        "--master",
        &master,
        "--tls",
        mixed.to_str().unwrap(),
        "R:0-9",
    ]);
    assert_fails_with(
        &run,
        5,
        &format!(
            "cannot reach the master at {master}: the TLS handshake failed: the server refused \
             this certificate: it is not signed by the server's CA"
        ),
    );
    let refused = |log: &str, why: &str| {
        log.lines()
            .any(|line| line.contains("refused a connection from 127.0.0.1:") && line.contains(why))
    };
    let not_signed = "the client's certificate is not signed by the cluster's CA";
    let plain = "the client does not speak TLS";
    let log = up.log_once(|log| refused(log, not_signed) && refused(log, plain));
    assert!(refused(&log, not_signed), "{log}");
    assert!(refused(&log, plain), "{log}");
}

#[test]
fn the_master_takes_its_certificates_from_the_cluster_file_unless_given_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    bitfold_certs::cluster_set(&certs, &["s0", "s1"]).unwrap();
    let slave = |name: &str| {
        let args: Vec<String> = [
            "slave",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join(name).to_str().unwrap(),
            "--tls",
            certs.join(name).to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Server::start("slave", &args).expect("a TLS slave starts")
    };
    let slaves = [slave("s0"), slave("s1")];
    let cluster_file = dir.path().join("cluster.toml");
    let write_cluster = |key: &str| {
        let mut text = String::from("group = 1\n");
        for (i, slave) in slaves.iter().enumerate() {
            text.push_str(&format!(
                "[[slaves]]\nname = \"s{i}\"\naddr = \"{}\"\n",
                slave.addr
            ));
        }
        // Relative to the cluster file's folder.
        text.push_str(&format!(
            "[tls]\nca = \"certs/ca/ca.pem\"\ncert = \"certs/master/cert.pem\"\nkey = \"{key}\"\n"
        ));
        fs::write(&cluster_file, text).unwrap();
    };
    let master_args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["master", "--listen", "127.0.0.1:0", "--cluster"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(cluster_file.display().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };

    // A key the cluster file names that is not there: the master says which
    // file, and where it was named.
    write_cluster("certs/master/nokey.pem");
    let missing = certs.join("master/nokey.pem");
    let run = bitfold(
        &master_args(&[])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let error = stderr(&run);
    assert!(
        error.starts_with("error: ")
            && error.contains(&format!("cannot read {}", missing.display()))
            && error.contains(&format!(
                "cannot use the TLS files the [tls] table of the cluster file {} names",
                cluster_file.display()
            )),
        "{error}"
    );
    // `--tls DIR` wins over the table.
    let master = Server::start(
        "master",
        &master_args(&["--tls", certs.join("master").to_str().unwrap()]),
    )
    .expect("the master starts with --tls");
    let client_tls = Tls::load(&certs.join("admin")).unwrap();
    let client = Client::connect_tls(&master.addr, &client_tls).unwrap();
    assert_eq!(client.status().unwrap().len(), 2);
    drop(client);
    drop(master);

    // With the right key the master runs TLS on every link from the file.
    write_cluster("certs/master/key.pem");
    let master = Server::start("master", &master_args(&[])).expect("the master starts");
    let client = Client::connect_tls(&master.addr, &client_tls).unwrap();
    crate::util::wait_until_all_up(&client);
    let mut oracle = Oracle::default();
    let mut rng = Rng(12);
    for vid in 0..20u64 {
        oracle.add(vid, (0..100).map(|_| rng.below(1 << 16) as u32));
    }
    import_over_tls(&master.addr, &certs.join("admin"), &oracle, dir.path());
    assert_answer(&client, "R:0-19", &oracle.range(&[(0, 19)]));
    assert_answer(&client, "R:0-9&5-19", &oracle.range(&[(0, 9), (5, 19)]));
    let plain = bitfold(&["query", "--master", &master.addr, "R:0-9"]);
    assert_eq!(plain.status.code(), Some(5), "{}", stderr(&plain));
}

#[test]
fn up_tls_on_the_tls_folder_of_an_earlier_bitfold_says_how_to_move_on() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    // What `up --tls` wrote before the CA was kept: no `ca/`, a `client/`.
    for folder in ["master", "s0", "client"] {
        fs::create_dir_all(tls.join(folder)).unwrap();
    }
    fs::write(tls.join("ca.pem"), "").unwrap();
    let run = bitfold(&[
        "up",
        "--tls",
        "--dir",
        dir.path().to_str().unwrap(),
        "--port",
        &free_port_block().to_string(),
        "--slaves",
        "1",
    ]);
    assert_fails_with(
        &run,
        1,
        &format!(
            "{0} holds TLS folders of an earlier bitfold (a `client` folder, or no kept CA in \
             `ca/`): remove {0} to have a new set made, whose clients use `admin/` (any command) \
             or `reader/` (queries only)",
            tls.display()
        ),
    );
}
