//! `--metrics` and `--slow` on real processes: the counters scraped over
//! HTTP move by exactly the queries run, per kind and outcome; the slaves'
//! byte and store counters grow; the master's slaves-up gauge follows a
//! killed slave; a slow query is logged with its coordinator and machines,
//! and in both plans with the bytes and time of each machine's hop. With
//! `--tls` the pages are HTTPS, only to a client certificate of the
//! cluster's CA that it has not revoked.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use bitfold_client::{Answer, Client, ErrorKind, Format};
use bitfold_engine::VectorBuf;
use bitfold_server::cluster::ClusterConfig;

use crate::util::{Server, free_port_block};

/// Vectors imported: vids `0..VECTORS`, vector `v` has bits `v..v + 200`.
const VECTORS: u64 = 24;

/// A loopback address nothing listens on right now.
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("a bound address").to_string()
}

/// The body of `GET /metrics` at `addr`.
fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .expect("the request is sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("the response is read");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
    assert!(head.starts_with("HTTP/1.0 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_owned()
}

/// The value of the sample named exactly `sample` (with its labels), 0 if absent.
fn value(page: &str, sample: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().expect("a sample value is a number"))
}

/// The sum over `pages` of the sample `sample`.
fn total(pages: &[String], sample: &str) -> f64 {
    pages.iter().map(|page| value(page, sample)).sum()
}

/// Slaves (each with `--metrics`) and a master with `master_args`, in `dir`.
struct Watched {
    slaves: Vec<Option<Server>>,
    slave_metrics: Vec<String>,
    master: Server,
    cluster: ClusterConfig,
}

impl Watched {
    fn start(dir: &Path, slaves: usize, master_args: &[&str]) -> Watched {
        let mut servers = Vec::new();
        let mut slave_metrics = Vec::new();
        let mut toml = String::from("replicas = 1\ngroup = 1\n");
        for i in 0..slaves {
            let metrics = free_addr();
            let args = [
                "slave",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                &dir.join(format!("s{i}")).display().to_string(),
                "--metrics",
                &metrics,
            ]
            .map(String::from);
            let server = Server::start("slave", &args).expect("a slave starts");
            toml.push_str(&format!(
                "[[slaves]]\nname = \"s{i}\"\naddr = \"{}\"\n",
                server.addr
            ));
            servers.push(Some(server));
            slave_metrics.push(metrics);
        }
        let file = dir.join("cluster.toml");
        std::fs::write(&file, toml).expect("the cluster file is written");
        let mut args: Vec<String> = [
            "master",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            &file.display().to_string(),
            "--data-dir",
            &dir.join("master-data").display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        args.extend(master_args.iter().map(|s| s.to_string()));
        let master = Server::start("master", &args).expect("the master starts");
        let cluster = ClusterConfig::load(&file).expect("the cluster file loads");
        Watched {
            slaves: servers,
            slave_metrics,
            master,
            cluster,
        }
    }

    fn client(&self) -> Client {
        connect_and_import(&self.master.addr)
    }

    fn slave_pages(&self) -> Vec<String> {
        self.slave_metrics.iter().map(|addr| scrape(addr)).collect()
    }

    /// The name of the slave that holds `vid`.
    fn owner(&self, vid: u64) -> String {
        let owner = self.cluster.placement().owners(vid)[0];
        self.cluster.slaves[owner].name.clone()
    }
}

/// A client of the master at `addr`, which imports the vectors `0..VECTORS`.
fn connect_and_import(addr: &str) -> Client {
    let client = Client::connect(addr).expect("the master accepts a client");
    let vectors: Vec<VectorBuf> = (0..VECTORS)
        .map(|v| VectorBuf::from_bits((v as u32..v as u32 + 200).collect()))
        .collect();
    let batch: Vec<_> = (0..VECTORS)
        .zip(vectors.iter().map(|v| v.as_part()))
        .collect();
    client.import(&batch).expect("the import succeeds");
    client
}

fn count(client: &Client, query: &str) -> Result<u64, ErrorKind> {
    match client.query(query, Format::Count) {
        Ok(Answer::Count(n)) => Ok(n),
        Ok(other) => panic!("{query}: a count was asked, got {other:?}"),
        Err(err) => Err(err.kind().unwrap_or_else(|| panic!("{query}: {err}"))),
    }
}

#[test]
fn counters_move_by_exactly_the_queries_run() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let master_metrics = free_addr();
    let mut cluster = Watched::start(dir.path(), 3, &["--metrics", &master_metrics]);
    let client = cluster.client();

    let imported = total(
        &cluster.slave_pages(),
        "bitfold_slave_imported_vectors_total",
    );
    assert_eq!(imported, VECTORS as f64, "every vector stored once");
    let stored = total(&cluster.slave_pages(), "bitfold_slave_store_vectors");
    assert_eq!(stored, VECTORS as f64);
    let master_before = scrape(&master_metrics);
    let slaves_before = cluster.slave_pages();
    assert_eq!(
        value(&master_before, "bitfold_master_imported_vectors_total"),
        VECTORS as f64
    );

    for query in ["R:0-3&2-9", "R:5&5-6", "R:1-20&0-1&1"] {
        assert!(count(&client, query).expect(query) > 0, "{query}");
    }
    for query in ["P:3", "P:17"] {
        assert_eq!(count(&client, query), Ok(200), "{query}");
    }
    assert_eq!(count(&client, "R:3-&4"), Err(ErrorKind::BadQuery));
    assert_eq!(count(&client, "P:999"), Err(ErrorKind::NotFound));

    let master_after = scrape(&master_metrics);
    let moved = |sample: &str| value(&master_after, sample) - value(&master_before, sample);
    let queries = r#"bitfold_master_queries_total{kind="#;
    assert_eq!(moved(&format!(r#"{queries}"range",outcome="ok"}}"#)), 3.0);
    assert_eq!(moved(&format!(r#"{queries}"point",outcome="ok"}}"#)), 2.0);
    assert_eq!(
        moved(&format!(r#"{queries}"unparsed",outcome="badQuery"}}"#)),
        1.0
    );
    assert_eq!(
        moved(&format!(r#"{queries}"point",outcome="notFound"}}"#)),
        1.0
    );
    let latencies = r#"bitfold_master_query_duration_seconds_count{kind="range"}"#;
    assert_eq!(moved(latencies), 3.0, "{master_after}");
    assert_eq!(moved("bitfold_master_retries_total"), 0.0);
    assert!(moved("bitfold_master_sent_bytes_total") > 0.0);
    let plans = moved(r#"bitfold_master_plans_total{plan="chain"}"#)
        + moved(r#"bitfold_master_plans_total{plan="fanOut"}"#);
    assert_eq!(plans, 3.0, "one plan per range query: {master_after}");

    let slaves_after = cluster.slave_pages();
    let grew = |sample: &str| total(&slaves_after, sample) - total(&slaves_before, sample);
    assert_eq!(
        grew(r#"bitfold_slave_requests_total{method="coordinate"}"#),
        3.0
    );
    assert_eq!(grew(r#"bitfold_slave_requests_total{method="fetch"}"#), 2.0);
    assert!(grew("bitfold_slave_read_bytes_total") > 0.0);
    assert!(grew("bitfold_slave_sent_bytes_total") > 0.0);
    for i in 0..3 {
        assert_eq!(
            value(
                &master_after,
                &format!(r#"bitfold_master_slave_up{{slave="s{i}"}}"#)
            ),
            1.0,
            "{master_after}"
        );
    }

    if let Some(mut slave) = cluster.slaves[2].take() {
        slave.kill();
    }
    // Status asks every slave, so the master sees the dead one now.
    let status = client.status().expect("status answers");
    assert!(!status[2].up, "{status:?}");
    let master_down = scrape(&master_metrics);
    assert_eq!(
        value(&master_down, r#"bitfold_master_slave_up{slave="s2"}"#),
        0.0
    );
    assert_eq!(
        value(&master_down, r#"bitfold_master_slave_up{slave="s0"}"#),
        1.0
    );
    let went_down = r#"bitfold_master_slave_transitions_total{slave="s2",to="down"}"#;
    assert_eq!(value(&master_down, went_down), 1.0, "{master_down}");
}

#[test]
fn up_serves_metrics_for_its_master_and_each_slave_on_the_ports_after() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let port = free_port_block();
    let metrics = loop {
        let block = free_port_block();
        if block.abs_diff(port) >= 4 {
            break block;
        }
    };
    let args = [
        "up",
        "--dir",
        &dir.path().join("cluster").display().to_string(),
        "--port",
        &port.to_string(),
        "--metrics",
        &format!("127.0.0.1:{metrics}"),
    ]
    .map(String::from);
    let up = Server::start("master", &args).expect("up starts");
    let client = connect_and_import(&up.addr);
    assert!(count(&client, "R:0-23").expect("the query is answered") > 0);

    let master = scrape(&format!("127.0.0.1:{metrics}"));
    assert_eq!(
        value(&master, "bitfold_master_imported_vectors_total"),
        VECTORS as f64,
        "{master}"
    );
    let slaves: Vec<String> = (1..=3)
        .map(|i| scrape(&format!("127.0.0.1:{}", metrics + i)))
        .collect();
    for page in &slaves {
        assert!(page.contains("bitfold_slave_store_vectors "), "{page}");
        assert!(!page.contains("bitfold_master_"), "a slave's page: {page}");
    }
    let stored = total(&slaves, "bitfold_slave_store_vectors");
    assert_eq!(stored, VECTORS as f64, "every vector on one slave");
    let coordinated = total(
        &slaves,
        r#"bitfold_slave_requests_total{method="coordinate"}"#,
    );
    assert_eq!(
        coordinated, 1.0,
        "one slave coordinated the one range query"
    );
}

/// `GET /metrics` at `addr` over TLS, as Prometheus scrapes with
/// `tls_config`: trusting `folder`'s `ca.pem`, presenting its `cert.pem`
/// and `key.pem` if `present`, asking for the server name `bitfold`
/// (Python's `ssl`, as an outside scraper). The response, or how it failed.
fn scrape_tls(addr: &str, folder: &Path, present: bool) -> Result<String, String> {
    const SCRAPE: &str = r#"
import socket, ssl, sys
host, port, folder, present = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
context = ssl.create_default_context(cafile=folder + "/ca.pem")
if present:
    context.load_cert_chain(folder + "/cert.pem", folder + "/key.pem")
with socket.create_connection((host, port), timeout=20) as raw:
    with context.wrap_socket(raw, server_hostname="bitfold") as tls:
        tls.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        response = b""
        while chunk := tls.recv(65536):
            response += chunk
sys.stdout.write(response.decode())
"#;
    let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
    let run = std::process::Command::new("python3")
        .args(["-c", SCRAPE, host, port, &folder.display().to_string()])
        .arg(if present { "1" } else { "0" })
        .output()
        .expect("python3 runs");
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    if run.status.success() {
        Ok(out)
    } else {
        Err(format!("{out}{}", String::from_utf8_lossy(&run.stderr)))
    }
}

/// What a plain HTTP `GET /metrics` at `addr` reads back, however it ends.
fn scrape_plain(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

#[test]
fn with_tls_metrics_are_https_to_a_client_certificate_of_the_cluster_ca_only() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cluster = dir.path().join("cluster");
    // The master at PORT, its slave at PORT + 1, their metrics after them.
    let port = free_port_block();
    let metrics = port + 2;
    let args = [
        "up",
        "--tls",
        "--slaves",
        "1",
        "--dir",
        &cluster.display().to_string(),
        "--port",
        &port.to_string(),
        "--metrics",
        &format!("127.0.0.1:{metrics}"),
    ]
    .map(String::from);
    let up = Server::start("master", &args).expect("up --tls starts");
    let (master, slave) = (
        format!("127.0.0.1:{metrics}"),
        format!("127.0.0.1:{}", metrics + 1),
    );
    let tls = cluster.join("tls");
    let printed = up.printed_once(|out| out.contains("server name bitfold"));
    for line in [
        format!("master metrics at https://{master}/metrics"),
        format!("slave s0 metrics at https://{slave}/metrics"),
        format!(
            "metrics need a client certificate of the cluster's CA: scrape with {}'s ca.pem, \
             cert.pem and key.pem, server name bitfold",
            tls.join("reader").display()
        ),
    ] {
        assert!(printed.contains(&line), "{line} in {printed}");
    }

    // A reader's or an admin's certificate gets each page.
    let page = scrape_tls(&master, &tls.join("reader"), true).expect("a reader scrapes");
    assert!(page.starts_with("HTTP/1.0 200 OK\r\n"), "{page}");
    assert!(page.contains("bitfold_master_sent_bytes_total "), "{page}");
    let page = scrape_tls(&slave, &tls.join("admin"), true).expect("an admin scrapes");
    assert!(page.contains("bitfold_slave_store_vectors "), "{page}");

    // Plain HTTP, or TLS without a certificate, gets nothing.
    for addr in [&master, &slave] {
        let plain = scrape_plain(addr);
        assert!(
            !plain.contains("HTTP/1.0") && !plain.contains("bitfold_"),
            "{plain:?}"
        );
        let anonymous = scrape_tls(addr, &tls.join("reader"), false)
            .expect_err("no page without a certificate");
        assert!(!anonymous.contains("bitfold_"), "{anonymous}");
    }

    // Neither does a certificate the CA revoked, once the servers have
    // re-read their folders (every 2 s).
    let mut ca = bitfold_certs::Authority::open(&tls.join("ca")).unwrap();
    let scraper = dir.path().join("scraper");
    ca.issue(bitfold_net::tls::Role::Reader, "scraper", 1, &scraper)
        .unwrap();
    assert!(scrape_tls(&master, &scraper, true).is_ok());
    ca.revoke("scraper").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while scrape_tls(&master, &scraper, true).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "a revoked certificate still scrapes after 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(scrape_tls(&master, &tls.join("reader"), true).is_ok());
    // The refusals are logged at debug only: nothing at the default level.
    assert!(!up.log().contains("metrics scrape"), "{}", up.log());
}

/// The master's slow-query line for `query`, waiting (a bounded time) for
/// the master to have written it: it logs after replying.
fn slow_line(master: &Server, query: &str) -> String {
    let line = |log: &str| {
        log.lines()
            .find(|line| line.contains("slow query") && line.contains(query))
            .map(str::to_owned)
    };
    let log = master.log_once(|log| line(log).is_some());
    line(&log).unwrap_or_else(|| panic!("no slow-query line: {log}"))
}

#[test]
fn a_slow_query_is_logged_with_its_coordinator_and_machines() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cluster = Watched::start(dir.path(), 2, &["--slow", "0ms", "--plan", "chain"]);
    let client = cluster.client();
    assert!(count(&client, "R:0-3&5").expect("the query is answered") > 0);

    let line = slow_line(&cluster.master, "R:0-3&5");
    assert!(line.contains("coordinator s"), "{line}");
    assert!(line.contains("plan chain"), "{line}");
    assert!(line.contains("outcome=\"ok\""), "{line}");
    let (first, second) = line
        .split_once("term 1: ")
        .and_then(|(_, rest)| rest.split_once(", term 2: "))
        .unwrap_or_else(|| panic!("two terms: {line}"));
    for vid in 0..4 {
        assert!(first.contains(&cluster.owner(vid)), "vid {vid}: {line}");
    }
    assert!(
        second.contains(&format!("{} (1 vid)", cluster.owner(5))),
        "{line}"
    );
}

/// One hop as a slow-query line shows it.
#[derive(Debug)]
struct LoggedHop {
    machine: String,
    /// What it did: `handle term N`, `gather` or `and`.
    what: String,
    vids: u64,
    read_bytes: u64,
}

/// The hops of the first attempt of a slow-query line.
fn hops(line: &str) -> Vec<LoggedHop> {
    let (_, hops) = line
        .split_once(" hops=attempt 1: ")
        .unwrap_or_else(|| panic!("no hops of attempt 1: {line}"));
    let hops = hops.split("; attempt ").next().expect("a first attempt");
    let number = |n: &str| -> u64 { n.parse().unwrap_or_else(|_| panic!("{n}: {line}")) };
    hops.trim_end()
        .strip_suffix(')')
        .unwrap_or_else(|| panic!("hops end with their figures: {line}"))
        .split("), ")
        .map(|hop| {
            let (name, figures) = hop
                .split_once(" (")
                .unwrap_or_else(|| panic!("a hop without figures: {hop} in {line}"));
            let (machine, what) = name.split_once(' ').expect("a machine and what it did");
            let mut logged = LoggedHop {
                machine: machine.to_owned(),
                what: what.to_owned(),
                vids: 0,
                read_bytes: 0,
            };
            for figure in figures.split(", ") {
                if let Some(n) = figure.strip_suffix(" vids").or(figure.strip_suffix(" vid")) {
                    logged.vids = number(n);
                }
                if let Some(n) = figure
                    .strip_prefix("read ")
                    .and_then(|f| f.strip_suffix(" B"))
                {
                    logged.read_bytes = number(n);
                }
            }
            logged
        })
        .collect()
}

#[test]
fn a_slow_query_is_logged_with_bytes_and_time_per_hop_in_both_plans() {
    for (plan, kind) in [("chain", "handle term"), ("fan-out", "gather")] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cluster = Watched::start(dir.path(), 3, &["--slow", "0ms", "--plan", plan]);
        let client = cluster.client();
        let query = "R:0-11&6-20";
        assert!(count(&client, query).expect("the query is answered") > 0);

        let line = slow_line(&cluster.master, query);
        let hops = hops(&line);
        let owners: BTreeSet<String> = (0..=20).map(|vid| cluster.owner(vid)).collect();
        assert!(owners.len() > 1, "the query spans machines: {owners:?}");
        for owner in &owners {
            let read: Vec<&LoggedHop> = hops
                .iter()
                .filter(|hop| &hop.machine == owner && hop.what.starts_with(kind))
                .collect();
            assert!(!read.is_empty(), "{plan}: no {kind} hop of {owner}: {line}");
            for hop in read {
                assert!(
                    hop.vids > 0 && hop.read_bytes > 0,
                    "{plan}: {hop:?}: {line}"
                );
            }
        }
        let vids: u64 = hops.iter().map(|hop| hop.vids).sum();
        assert_eq!(
            vids,
            12 + 15,
            "{plan}: every vid of both terms read once: {line}"
        );
        let and = hops.last().expect("hops were logged");
        assert_eq!(
            and.what, "and",
            "{plan}: the coordinator's AND ends the hops: {line}"
        );
        assert!(
            and.read_bytes > 0,
            "{plan}: the AND read the term vectors: {line}"
        );
        assert!(
            line.contains(&format!("coordinator {} (", and.machine)),
            "{plan}: the AND is the coordinator's: {line}"
        );
    }
}
