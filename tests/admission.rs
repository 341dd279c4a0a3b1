//! Without `--tls`, a slave given its cluster file (`bitfold slave
//! --cluster FILE`) admits connections only from the addresses of the
//! file's master and slaves (docs/protocol.md §11): one from elsewhere is
//! closed at once and logged once a minute at most, a file that no longer
//! parses keeps the addresses admitted before, and a slave added to the
//! file is admitted within seconds.

use std::net::Ipv4Addr;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use bitfold_client::{Answer, Client, Format};
use bitfold_proto::bitfold_capnp::slave;

use crate::util::{
    Server, connect_capnp_from, free_port_block, import_one_bit_each, wait_until_all_up,
};

/// An address of this machine that the cluster file does not name.
const STRANGER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// How a slave logs a refusal of [`STRANGER`].
const REFUSED: &str = "refused a connection from 127.0.0.2:";

/// Asks the slave at `addr` for its health over a connection from
/// `source`: the number of vectors it holds, or why it did not answer.
fn health_from(source: Ipv4Addr, addr: &str) -> Result<u64, String> {
    bitfold_net::block_on_local(async {
        let slave: slave::Client = connect_capnp_from(source, addr).await?;
        let call = async {
            let health = slave.health_request().send().promise.await?;
            Ok::<_, capnp::Error>(health.get()?.get_vectors())
        };
        match tokio::time::timeout(Duration::from_secs(10), call).await {
            Ok(answer) => answer.map_err(|e| e.to_string()),
            Err(_) => Err("no answer within 10 s".to_owned()),
        }
    })
    .expect("a runtime")
}

/// The cluster file: the master at `port`, then a slave per address.
fn write_cluster(path: &Path, port: u16, slaves: &[String]) {
    let mut text = format!("master = \"127.0.0.1:{port}\"\ngroup = 1\n");
    for (i, addr) in slaves.iter().enumerate() {
        text.push_str(&format!("[[slaves]]\nname = \"s{i}\"\naddr = \"{addr}\"\n"));
    }
    std::fs::write(path, text).expect("the cluster file is written");
}

/// The count of `R:0-9` through `client`.
fn count(client: &Client) -> u64 {
    match client.query("R:0-9", Format::Count) {
        Ok(Answer::Count(n)) => n,
        other => panic!("R:0-9 as a count: {other:?}"),
    }
}

#[test]
fn a_slave_given_its_cluster_file_admits_only_the_clusters_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port_block();
    let file = dir.path().join("cluster.toml");
    let s0 = format!("127.0.0.1:{}", port + 1);
    write_cluster(&file, port, std::slice::from_ref(&s0));
    let arg = |path: &Path| path.display().to_string();
    let slave = Server::start(
        "slave",
        &[
            "slave".into(),
            "--listen".into(),
            s0.clone(),
            "--data-dir".into(),
            arg(&dir.path().join("s0")),
            "--cluster".into(),
            arg(&file),
        ],
    )
    .expect("the slave starts");
    let master = Server::start(
        "master",
        &[
            "master".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--cluster".into(),
            arg(&file),
            "--data-dir".into(),
            arg(&dir.path().join("master-data")),
        ],
    )
    .expect("the master starts");

    // The master, from 127.0.0.1, is served.
    let client = Client::connect(&master.addr).unwrap();
    wait_until_all_up(&client);
    import_one_bit_each(&client, 10, 1 << 16);
    let expected = 10;
    assert_eq!(count(&client), expected);
    assert_eq!(health_from(Ipv4Addr::LOCALHOST, &slave.addr), Ok(10));

    // Another address of the same machine is not: its connection closes
    // at once, and the slave says why, once however often it dials.
    let refused = health_from(STRANGER, &slave.addr).expect_err("a stranger is refused");
    assert!(
        !refused.contains("no answer within"),
        "closed at once: {refused}"
    );
    let log = slave.log_once(|log| log.contains(REFUSED));
    let line = log
        .lines()
        .find(|line| line.contains(REFUSED))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains(
            "127.0.0.2 is none of the addresses of the master and slaves of the cluster file"
        ) && line.contains(&arg(&file))
            && line.contains("--tls"),
        "{line}"
    );
    for _ in 0..3 {
        assert!(health_from(STRANGER, &slave.addr).is_err());
    }
    thread::sleep(Duration::from_millis(300));
    assert_eq!(slave.log().matches(REFUSED).count(), 1, "{}", slave.log());

    // A file that no longer parses keeps the addresses admitted before.
    std::fs::write(&file, "master = \n").unwrap();
    let kept = "kept the addresses admitted before: cluster file";
    let log = slave.log_once(|log| log.contains(kept));
    assert!(log.contains(kept), "{log}");
    assert_eq!(health_from(Ipv4Addr::LOCALHOST, &slave.addr), Ok(10));

    // A slave added to the file is admitted once the slave re-reads it.
    write_cluster(
        &file,
        port,
        &[s0.clone(), format!("{STRANGER}:{}", port + 2)],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while health_from(STRANGER, &slave.addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "127.0.0.2 is still refused: {}",
            slave.log()
        );
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(count(&client), expected);
}

#[test]
fn a_slave_without_its_cluster_file_says_it_admits_every_address() {
    let dir = tempfile::tempdir().unwrap();
    let slave = Server::start(
        "slave",
        &[
            "slave".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            dir.path().join("s0").display().to_string(),
        ],
    )
    .expect("the slave starts");
    let warning = "this slave admits connections from any address: start it with its cluster \
                   file (`bitfold slave --cluster FILE`)";
    let log = slave.log_once(|log| log.contains(warning));
    assert_eq!(log.matches(warning).count(), 1, "{log}");
    assert!(health_from(STRANGER, &slave.addr).is_ok());
}
