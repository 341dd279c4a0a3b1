//! An in-process cluster on 127.0.0.1 (a [`LocalCluster`] on free ports,
//! stopped when dropped, even on failure), and an oracle to check answers by.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bitfold_client::{Answer, Client, Error, Format, LocalClient};
use bitfold_engine::store::Store;
use bitfold_engine::{VectorBuf, VectorPart, portable};
use bitfold_server::cluster::ClusterConfig;
use bitfold_server::local::{LocalCluster, Server, loopback};
use bitfold_server::master::MasterOptions;

/// A listener that accepts connections and never answers: a hung slave
/// (as under SIGSTOP: connections open, no reply ever).
fn start_hang(addr: SocketAddr) -> Server {
    Server::spawn("hung slave", move |ready, stopped| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_reuseaddr(true).unwrap();
            socket.bind(addr).expect("the port is free again");
            let listener = socket.listen(64).unwrap();
            ready(listener.local_addr().unwrap());
            let mut held = Vec::new();
            let accept = async {
                loop {
                    if let Ok((stream, _)) = listener.accept().await {
                        held.push(stream);
                    }
                }
            };
            tokio::select! {
                () = accept => {}
                () = stopped => {}
            }
        });
        Ok(())
    })
    .expect("the hung slave listens")
}

/// Options for the tests: shorter timeouts so that hung slaves are found
/// quickly, yet long enough for a loaded machine to answer small queries.
pub fn test_options(options: &mut MasterOptions) {
    options.rpc_timeout = Duration::from_secs(3);
    options.query_timeout = Duration::from_secs(20);
    options.probe_interval = Duration::from_millis(100);
}

/// A [`LocalCluster`] in a temporary directory, and the listeners that
/// stand in for hung slaves.
pub struct TestCluster {
    local: LocalCluster,
    hung: Vec<Option<Server>>,
    pub addrs: Vec<SocketAddr>,
    pub config: ClusterConfig,
    pub root: tempfile::TempDir,
    _empty_stores: Vec<tempfile::TempDir>,
}

impl TestCluster {
    pub fn start(slaves: usize, replicas: usize) -> TestCluster {
        Self::start_with(slaves, replicas, |_| {})
    }

    pub fn start_with(
        slaves: usize,
        replicas: usize,
        tune: impl FnOnce(&mut MasterOptions),
    ) -> TestCluster {
        let root = tempfile::tempdir().unwrap();
        // The tests reason about which slave holds which of a few dozen
        // vids: placed one by one, they spread over every slave. Groups
        // have their own test (random queries).
        let mut config = loopback(slaves, replicas);
        config.group = 1;
        let local = LocalCluster::start(root.path(), config, "127.0.0.1:0", |o| {
            test_options(o);
            tune(o);
        })
        .expect("the cluster starts");
        let config = local.cluster().clone();
        let addrs = config
            .slaves
            .iter()
            .map(|s| s.addr.parse().unwrap())
            .collect();
        TestCluster {
            local,
            hung: (0..slaves).map(|_| None).collect(),
            addrs,
            config,
            root,
            _empty_stores: Vec::new(),
        }
    }

    /// The master's address, `HOST:PORT`.
    pub fn master_addr(&self) -> String {
        self.local.master_addr().to_string()
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.master_addr()).expect("the master answers")
    }

    /// The store each slave serves.
    pub fn stores(&self) -> &[Arc<Store>] {
        self.local.stores()
    }

    /// The master's data directory.
    pub fn master_dir(&self) -> PathBuf {
        LocalCluster::master_dir(self.root.path())
    }

    /// Stops slave `i` and puts a listener that never answers in its place.
    pub fn hang_slave(&mut self, i: usize) {
        self.stop_slave(i);
        self.hung[i] = Some(start_hang(self.addrs[i]));
    }

    /// Stops slave `i` (its port refuses connections).
    pub fn stop_slave(&mut self, i: usize) {
        self.hung[i] = None;
        self.local.stop_slave(i).expect("the slave stops cleanly");
    }

    /// Starts slave `i` again on its address, with the store it had.
    pub fn restart_slave(&mut self, i: usize) {
        self.hung[i] = None;
        self.local.restart_slave(i).expect("the slave starts again");
    }

    /// Starts slave `i` again on its address with an empty store (its data lost).
    pub fn restart_slave_empty(&mut self, i: usize) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        self._empty_stores.push(dir);
        self.hung[i] = None;
        self.local
            .restart_slave_with(i, store)
            .expect("the slave starts again");
    }

    /// Stops the master and starts a new one on the same data directory.
    pub fn restart_master(&mut self) {
        self.local
            .restart_master()
            .expect("the master starts again");
    }
}

#[path = "../../../../tests/oracle.rs"]
mod oracle;
pub use oracle::Oracle;

/// A client of either kind, as the helpers below call it.
pub trait Ask {
    fn query(&self, message: &str, format: Format) -> Result<Answer, Error>;
    fn import(&self, batch: &[(u64, VectorPart<'_>)]) -> Result<(), Error>;
}

impl Ask for Client {
    fn query(&self, message: &str, format: Format) -> Result<Answer, Error> {
        Client::query(self, message, format)
    }

    fn import(&self, batch: &[(u64, VectorPart<'_>)]) -> Result<(), Error> {
        Client::import(self, batch)
    }
}

impl Ask for LocalClient {
    fn query(&self, message: &str, format: Format) -> Result<Answer, Error> {
        LocalClient::query(self, message, format)
    }

    fn import(&self, batch: &[(u64, VectorPart<'_>)]) -> Result<(), Error> {
        LocalClient::import(self, batch)
    }
}

/// Imports `(vid, bits)` through the client and records them in the oracle.
pub fn import(client: &impl Ask, oracle: &mut Oracle, vectors: &[(u64, Vec<u32>)]) {
    let bufs: Vec<(u64, VectorBuf)> = vectors
        .iter()
        .map(|(vid, bits)| (*vid, VectorBuf::from_bits(bits.clone())))
        .collect();
    let batch: Vec<_> = bufs
        .iter()
        .map(|(vid, buf)| (*vid, buf.as_part()))
        .collect();
    client.import(&batch).expect("the import succeeds");
    for (vid, bits) in vectors {
        oracle.add(*vid, bits);
    }
}

/// The set bits of an answer in any form but count.
pub fn bits_of(answer: &Answer) -> BTreeSet<u32> {
    match answer {
        Answer::Words(bytes) => {
            assert_eq!(bytes.len() % 8, 0, "words are whole u64s");
            if let Some(last) = bytes.chunks_exact(8).last() {
                assert_ne!(last, [0; 8], "trailing zero words are trimmed");
            }
            bytes
                .chunks_exact(8)
                .enumerate()
                .flat_map(|(i, word)| {
                    let word = u64::from_le_bytes(word.try_into().unwrap());
                    (0..64)
                        .filter(move |b| word >> b & 1 == 1)
                        .map(move |b| (i * 64 + b) as u32)
                })
                .collect()
        }
        Answer::Roaring(bytes) => portable::read(bytes)
            .expect("a valid portable roaring bitmap")
            .as_part()
            .bits()
            .collect(),
        Answer::Count(_) => panic!("a count has no bits"),
    }
}

/// Runs `message` in all three forms and checks each against `expected`.
#[track_caller]
pub fn check(client: &impl Ask, message: &str, expected: &BTreeSet<u32>) {
    for format in [Format::Words, Format::Roaring] {
        let answer = client
            .query(message, format)
            .unwrap_or_else(|e| panic!("{message} as {format:?}: {e}"));
        assert_eq!(&bits_of(&answer), expected, "{message} as {format:?}");
    }
    assert_eq!(
        client.query(message, Format::Count).unwrap(),
        Answer::Count(expected.len() as u64),
        "{message} as count"
    );
}
