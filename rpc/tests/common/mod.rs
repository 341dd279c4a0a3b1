//! An in-process cluster on 127.0.0.1: real servers in threads of the test,
//! on free ports, stopped when the cluster is dropped (even on failure).

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bitfold_engine::store::Store;
use bitfold_engine::{VectorBuf, portable};
use bitfold_rpc::client::{Answer, Client, Format};
use bitfold_rpc::cluster::{ClusterConfig, SlaveEntry};
use bitfold_rpc::master::{self, MasterOptions};
use bitfold_rpc::slave::{self, SlaveOptions};
use futures::channel::oneshot;

/// A server thread and the switch that stops it.
struct Server {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("a server thread panicked");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn_server(
    name: &str,
    serve: impl FnOnce(Box<dyn FnOnce(SocketAddr) + Send>, oneshot::Receiver<()>) + Send + 'static,
) -> (Server, SocketAddr) {
    let (ready, addr) = mpsc::channel();
    let (stop, stopped) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            serve(
                Box::new(move |addr| ready.send(addr).expect("the test waits")),
                stopped,
            )
        })
        .unwrap();
    let addr = addr
        .recv_timeout(Duration::from_secs(20))
        .expect("the server became ready");
    (
        Server {
            stop: Some(stop),
            thread: Some(thread),
        },
        addr,
    )
}

fn start_slave(store: Arc<Store>, listen: String) -> (Server, SocketAddr) {
    spawn_server("slave", move |ready, stopped| {
        let options = SlaveOptions::new(listen, PathBuf::new());
        slave::serve_store(store, &options, ready, async {
            let _ = stopped.await;
        })
        .expect("the slave serves");
    })
}

/// A listener that accepts connections and never answers: a hung slave
/// (as under SIGSTOP: connections open, no reply ever).
fn start_hang(addr: SocketAddr) -> (Server, SocketAddr) {
    spawn_server("hung slave", move |ready, stopped| {
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
                _ = stopped => {}
            }
        });
    })
}

/// Options for the tests: shorter timeouts so that hung slaves are found
/// quickly, yet long enough for a loaded machine to answer small queries.
pub fn test_options(cluster: ClusterConfig, data_dir: PathBuf) -> MasterOptions {
    let mut options = MasterOptions::new("127.0.0.1:0", cluster, data_dir);
    options.rpc_timeout = Duration::from_secs(3);
    options.query_timeout = Duration::from_secs(20);
    options.probe_interval = Duration::from_millis(100);
    options
}

/// Slaves (stores in temporary directories) and a master with a temporary data dir.
pub struct TestCluster {
    pub stores: Vec<Arc<Store>>,
    pub addrs: Vec<SocketAddr>,
    slaves: Vec<Server>,
    master: Option<Server>,
    pub master_addr: SocketAddr,
    pub config: ClusterConfig,
    pub data_dir: tempfile::TempDir,
    _store_dirs: Vec<tempfile::TempDir>,
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
        let store_dirs: Vec<tempfile::TempDir> =
            (0..slaves).map(|_| tempfile::tempdir().unwrap()).collect();
        let stores: Vec<Arc<Store>> = store_dirs
            .iter()
            .map(|dir| Arc::new(Store::open(dir.path()).expect("a fresh store opens")))
            .collect();
        let mut servers = Vec::new();
        let mut addrs = Vec::new();
        for store in &stores {
            let (server, addr) = start_slave(store.clone(), "127.0.0.1:0".into());
            servers.push(server);
            addrs.push(addr);
        }
        let config = ClusterConfig {
            group: 1,
            replicas,
            slaves: addrs
                .iter()
                .enumerate()
                .map(|(i, addr)| SlaveEntry {
                    name: format!("s{i}"),
                    addr: addr.to_string(),
                })
                .collect(),
        };
        let data_dir = tempfile::tempdir().unwrap();
        let mut options = test_options(config.clone(), data_dir.path().to_owned());
        tune(&mut options);
        let (master, master_addr) = start_master(options);
        TestCluster {
            stores,
            addrs,
            slaves: servers,
            master: Some(master),
            master_addr,
            config,
            data_dir,
            _store_dirs: store_dirs,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.master_addr.to_string()).expect("the master answers")
    }

    /// Stops slave `i` and puts a listener that never answers in its place.
    pub fn hang_slave(&mut self, i: usize) {
        self.slaves[i].stop();
        let (hung, _) = start_hang(self.addrs[i]);
        self.slaves[i] = hung;
    }

    /// Stops slave `i` (its port refuses connections).
    pub fn stop_slave(&mut self, i: usize) {
        self.slaves[i].stop();
    }

    /// Starts slave `i` again on its address, with the store it had.
    pub fn restart_slave(&mut self, i: usize) {
        self.slaves[i].stop();
        let (server, _) = start_slave(self.stores[i].clone(), self.addrs[i].to_string());
        self.slaves[i] = server;
    }

    /// Starts slave `i` again on its address with an empty store (its data lost).
    pub fn restart_slave_empty(&mut self, i: usize) {
        let dir = tempfile::tempdir().unwrap();
        self.stores[i] = Arc::new(Store::open(dir.path()).unwrap());
        self._store_dirs.push(dir);
        self.restart_slave(i);
    }

    /// Stops the master and starts a new one on the same data directory.
    pub fn restart_master(&mut self) {
        if let Some(mut master) = self.master.take() {
            master.stop();
        }
        let options = test_options(self.config.clone(), self.data_dir.path().to_owned());
        let (master, addr) = start_master(options);
        self.master = Some(master);
        self.master_addr = addr;
    }
}

fn start_master(options: MasterOptions) -> (Server, SocketAddr) {
    spawn_server("master", move |ready, stopped| {
        master::run_until(options, ready, async {
            let _ = stopped.await;
        })
        .expect("the master serves");
    })
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Some(mut master) = self.master.take() {
            master.stop();
        }
        for slave in &mut self.slaves {
            slave.stop();
        }
    }
}

/// The vectors imported so far, to compute expected answers.
#[derive(Default, Clone)]
pub struct Oracle {
    pub vectors: BTreeMap<u64, BTreeSet<u32>>,
}

impl Oracle {
    pub fn add(&mut self, vid: u64, bits: &[u32]) {
        if !bits.is_empty() {
            self.vectors.entry(vid).or_default().extend(bits);
        }
    }

    /// The answer of `R:` over inclusive `terms`.
    pub fn range(&self, terms: &[(u64, u64)]) -> BTreeSet<u32> {
        let mut answer: Option<BTreeSet<u32>> = None;
        for &(first, last) in terms {
            let union: BTreeSet<u32> = self
                .vectors
                .range(first..=last)
                .flat_map(|(_, bits)| bits.iter().copied())
                .collect();
            answer = Some(match answer {
                None => union,
                Some(acc) => acc.intersection(&union).copied().collect(),
            });
        }
        answer.unwrap_or_default()
    }
}

/// Imports `(vid, bits)` through the client and records them in the oracle.
pub fn import(client: &Client, oracle: &mut Oracle, vectors: &[(u64, Vec<u32>)]) {
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
pub fn check(client: &Client, message: &str, expected: &BTreeSet<u32>) {
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
