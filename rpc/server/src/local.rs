//! A whole cluster in one process: a master and slaves serving on threads
//! of this process, on loopback, each slave with its data directory. Used by
//! `bitfold up`, `demo` and `bench`, by the comparison with other systems,
//! and by the tests.
//!
//! Every server stops when it is dropped or stopped explicitly, and the
//! cluster can stop, restart or replace one slave (or restart the master)
//! while the others keep serving.
//!
//! ```no_run
//! use bitfold_client::{Client, Format};
//! use bitfold_server::local::{LocalCluster, loopback};
//!
//! let dir = std::env::temp_dir().join("bitfold-local-example");
//! let local = LocalCluster::start(&dir, loopback(3, 1), "127.0.0.1:0", |_| {})?;
//! let client = Client::connect(&local.master_addr().to_string())?;
//! client.query("R:1-9", Format::Count)?;
//! local.stop()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bitfold_engine::store::Store;
use futures::channel::oneshot;
use futures::future::BoxFuture;

use crate::cluster::{ClusterConfig, MasterEntry, SlaveEntry};
use crate::master::{self, MasterOptions, Replication};
use crate::slave::{self, Admit, SlaveOptions};
use crate::tls::{Tls, TlsError};

/// How long a server may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a server of a local cluster did not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No thread could be started for the server.
    #[error("cannot start a thread for {server}")]
    Thread {
        /// The server, as `slave s0` or `the master`.
        server: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The server did not report its address in time.
    #[error("{server} did not start listening within {}s", START_TIMEOUT.as_secs())]
    Timeout {
        /// The server.
        server: String,
    },
    /// The server failed, starting or serving.
    #[error("{server} stopped")]
    Failed {
        /// The server.
        server: String,
        /// Why it stopped.
        source: crate::Error,
    },
    /// The server stopped serving though it was not asked to.
    #[error("{server} stopped serving")]
    Ended {
        /// The server.
        server: String,
    },
    /// A server's TLS folder could not be read.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Completes when a server is asked to stop.
pub type StopSignal = BoxFuture<'static, ()>;

/// Told the address a server listens on, once it accepts connections.
pub type Ready = Box<dyn FnOnce(SocketAddr) + Send>;

/// One server on its own thread; stopped (and its thread joined) when
/// dropped or by [`Server::stop`].
pub struct Server {
    name: String,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), crate::Error>>>,
}

impl Server {
    /// Runs `serve(ready, stop)` on a thread named `name` and returns once
    /// it has called `ready`. `serve` must stop serving when `stop`
    /// completes.
    pub fn spawn(
        name: &str,
        serve: impl FnOnce(Ready, StopSignal) -> Result<(), crate::Error> + Send + 'static,
    ) -> Result<Server, Error> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let ready: Ready = Box::new(move |addr| {
                    let _ = ready_tx.send(addr);
                });
                serve(
                    ready,
                    Box::pin(async move {
                        let _ = stopped.await;
                    }),
                )
            })
            .map_err(|source| Error::Thread {
                server: name.to_owned(),
                source,
            })?;
        let mut server = Server {
            name: name.to_owned(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            stop: Some(stop),
            thread: Some(thread),
        };
        match ready_rx.recv_timeout(START_TIMEOUT) {
            Ok(addr) => {
                server.addr = addr;
                Ok(server)
            }
            // The thread ended without becoming ready: it says why.
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(server.stop().err().unwrap_or_else(|| Error::Ended {
                    server: name.to_owned(),
                }))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Left to finish starting on its own: joining it could wait forever.
                server.thread = None;
                Err(Error::Timeout {
                    server: name.to_owned(),
                })
            }
        }
    }

    /// A slave named `name` serving `store` as `options` say.
    pub fn slave(name: &str, store: Arc<Store>, options: SlaveOptions) -> Result<Server, Error> {
        Server::spawn(&format!("slave {name}"), move |ready, stop| {
            slave::serve_store(store, &options, ready, stop)
        })
    }

    /// A master serving as `options` say.
    pub fn master(options: MasterOptions) -> Result<Server, Error> {
        Server::spawn("the master", move |ready, stop| {
            master::run_until(options, ready, stop)
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Why it stopped, if it stopped without being asked to.
    pub fn failure(&mut self) -> Option<Error> {
        let finished = self.thread.as_ref().is_some_and(JoinHandle::is_finished);
        if !finished {
            return None;
        }
        Some(self.stop().err().unwrap_or_else(|| Error::Ended {
            server: self.name.clone(),
        }))
    }

    /// Stops serving (closing every connection) and waits for its thread;
    /// the error it stopped with, if any. Stopping again does nothing.
    pub fn stop(&mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        match thread.join() {
            Ok(outcome) => outcome.map_err(|source| Error::Failed {
                server: self.name.clone(),
                source,
            }),
            Err(panic) if !thread::panicking() => std::panic::resume_unwind(panic),
            Err(_) => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A cluster file for `slaves` slaves named s0, s1, ... on free loopback
/// ports (each picks one when it starts), with `replicas` copies of every vector.
pub fn loopback(slaves: usize, replicas: usize) -> ClusterConfig {
    ClusterConfig {
        replicas,
        group: crate::cluster::DEFAULT_GROUP,
        piece: crate::pieces::DEFAULT_PIECE,
        slaves: (0..slaves)
            .map(|i| SlaveEntry {
                name: format!("s{i}"),
                addr: "127.0.0.1:0".into(),
            })
            .collect(),
    }
}

/// The master's TLS folder among a local cluster's (each slave's is named
/// after it).
pub const MASTER_TLS: &str = "master";

/// A master (or several, whose records Raft replicates) and its slaves,
/// serving from threads of this process; all of them stop when it is
/// dropped or by [`LocalCluster::stop`].
pub struct LocalCluster {
    cluster: ClusterConfig,
    stores: Vec<Arc<Store>>,
    slave_options: Vec<SlaveOptions>,
    slaves: Vec<Server>,
    master_options: Vec<MasterOptions>,
    masters: Vec<Server>,
}

/// The masters a local cluster starts.
enum Masters<'a> {
    /// One, listening on this address.
    One(&'a str),
    /// Several, as these entries say.
    Replicated(&'a [MasterEntry]),
}

impl LocalCluster {
    /// Starts the slaves of `cluster` on their addresses (port 0: a free
    /// one), each serving the store in [`LocalCluster::slave_dir`], then a
    /// master on `master_listen` with its data in
    /// [`LocalCluster::master_dir`] and its options changed by `tune`.
    pub fn start(
        root: &Path,
        cluster: ClusterConfig,
        master_listen: &str,
        tune: impl FnOnce(&mut MasterOptions),
    ) -> Result<LocalCluster, Error> {
        LocalCluster::start_tls(root, cluster, master_listen, None, tune)
    }

    /// Like [`LocalCluster::start`], and with `tls`, a folder holding a TLS
    /// folder for each server of this cluster, every link runs mutual TLS:
    /// each slave uses `tls/NAME`, the master `tls/master` ([`MASTER_TLS`]).
    pub fn start_tls(
        root: &Path,
        cluster: ClusterConfig,
        master_listen: &str,
        tls: Option<&Path>,
        tune: impl FnOnce(&mut MasterOptions),
    ) -> Result<LocalCluster, Error> {
        LocalCluster::start_tuned(root, cluster, master_listen, tls, |_, _| {}, tune)
    }

    /// Like [`LocalCluster::start_tls`], and each slave's options are
    /// changed by `tune_slave` (given its index in the cluster file) before
    /// it starts; a restarted slave keeps them. Without TLS each slave
    /// admits only the addresses of the cluster's hosts and of
    /// `master_listen`'s ([`Admit::Hosts`]), as `bitfold slave --cluster` does.
    pub fn start_tuned(
        root: &Path,
        cluster: ClusterConfig,
        master_listen: &str,
        tls: Option<&Path>,
        tune_slave: impl FnMut(usize, &mut SlaveOptions),
        tune: impl FnOnce(&mut MasterOptions),
    ) -> Result<LocalCluster, Error> {
        let masters = Masters::One(master_listen);
        let mut tune = Some(tune);
        let tune = |options: &mut MasterOptions| tune.take().map_or((), |tune| tune(options));
        LocalCluster::launch(root, cluster, masters, tls, tune_slave, tune)
    }

    /// Like [`LocalCluster::start_tuned`], with the several `masters`
    /// (docs/protocol.md §12), each with its data in
    /// [`LocalCluster::master_dir`]`/NAME` and its options changed by `tune`.
    pub fn start_replicated(
        root: &Path,
        cluster: ClusterConfig,
        masters: &[MasterEntry],
        tls: Option<&Path>,
        tune_slave: impl FnMut(usize, &mut SlaveOptions),
        tune: impl FnMut(&mut MasterOptions),
    ) -> Result<LocalCluster, Error> {
        let masters = Masters::Replicated(masters);
        LocalCluster::launch(root, cluster, masters, tls, tune_slave, tune)
    }

    fn launch(
        root: &Path,
        cluster: ClusterConfig,
        masters: Masters<'_>,
        tls: Option<&Path>,
        mut tune_slave: impl FnMut(usize, &mut SlaveOptions),
        mut tune: impl FnMut(&mut MasterOptions),
    ) -> Result<LocalCluster, Error> {
        let load = |name: &str| tls.map(|dir| Tls::load(&dir.join(name))).transpose();
        let hosts = cluster.slaves.iter().map(|slave| slave.addr.clone());
        let master_hosts: Vec<String> = match &masters {
            Masters::One(listen) => vec![listen.to_string()],
            Masters::Replicated(entries) => entries.iter().map(|m| m.addr.clone()).collect(),
        };
        let admit = Admit::Hosts(hosts.chain(master_hosts).collect());
        let mut stores = Vec::new();
        let mut slave_options = Vec::new();
        let mut slaves = Vec::new();
        let mut bound = Vec::new();
        for (i, entry) in cluster.slaves.iter().enumerate() {
            let dir = LocalCluster::slave_dir(root, &entry.name);
            let store = Store::open(&dir).map_err(|source| Error::Failed {
                server: format!("slave {}", entry.name),
                source: source.into(),
            })?;
            let store = Arc::new(store);
            let mut options = SlaveOptions::new(entry.addr.clone(), dir);
            options.tls = load(&entry.name)?;
            options.admit = admit.clone();
            tune_slave(i, &mut options);
            let server = Server::slave(&entry.name, store.clone(), options.clone())?;
            bound.push(SlaveEntry {
                name: entry.name.clone(),
                addr: server.addr().to_string(),
            });
            // A restarted slave comes back on the address it had.
            slave_options.push(SlaveOptions {
                listen: server.addr().to_string(),
                ..options
            });
            stores.push(store);
            slaves.push(server);
        }
        let cluster = ClusterConfig {
            slaves: bound,
            ..cluster
        };
        let each: Vec<(String, PathBuf, Option<Replication>)> = match masters {
            Masters::One(listen) => vec![(listen.to_owned(), LocalCluster::master_dir(root), None)],
            Masters::Replicated(entries) => entries
                .iter()
                .map(|entry| {
                    let place = Replication {
                        name: entry.name.clone(),
                        masters: entries.to_vec(),
                    };
                    let dir = LocalCluster::master_dir(root).join(&entry.name);
                    (entry.addr.clone(), dir, Some(place))
                })
                .collect(),
        };
        let mut master_options = Vec::new();
        let mut started = Vec::new();
        for (listen, dir, replication) in each {
            let mut options = MasterOptions::new(listen, cluster.clone(), dir);
            options.tls = load(MASTER_TLS)?;
            options.replication = replication;
            tune(&mut options);
            let master = Server::master(options.clone())?;
            options.listen = master.addr().to_string();
            master_options.push(options);
            started.push(master);
        }
        Ok(LocalCluster {
            cluster,
            stores,
            slave_options,
            slaves,
            master_options,
            masters: started,
        })
    }

    /// The data directory of slave `name` of a cluster under `root`.
    pub fn slave_dir(root: &Path, name: &str) -> PathBuf {
        root.join(name)
    }

    /// The master's data directory of a cluster under `root`.
    pub fn master_dir(root: &Path) -> PathBuf {
        root.join("master-data")
    }

    /// Where the master answers (the first, of several).
    pub fn master_addr(&self) -> SocketAddr {
        self.masters[0].addr()
    }

    /// Where each master answers.
    pub fn master_addrs(&self) -> Vec<SocketAddr> {
        self.masters.iter().map(Server::addr).collect()
    }

    /// The cluster file the master serves, with the addresses the slaves listen on.
    pub fn cluster(&self) -> &ClusterConfig {
        &self.cluster
    }

    /// The store each slave serves, in cluster-file order.
    pub fn stores(&self) -> &[Arc<Store>] {
        &self.stores
    }

    /// Stops slave `i` (its port refuses connections until it starts again).
    pub fn stop_slave(&mut self, i: usize) -> Result<(), Error> {
        self.slaves[i].stop()
    }

    /// Stops slave `i` if it serves, and starts it again on its address
    /// with the store it had.
    pub fn restart_slave(&mut self, i: usize) -> Result<(), Error> {
        self.restart_slave_with(i, self.stores[i].clone())
    }

    /// Stops slave `i` if it serves, and starts it again on its address
    /// serving `store` instead (an empty one: a machine that lost its disk).
    pub fn restart_slave_with(&mut self, i: usize, store: Arc<Store>) -> Result<(), Error> {
        self.slaves[i].stop()?;
        self.stores[i] = store.clone();
        let name = &self.cluster.slaves[i].name;
        self.slaves[i] = Server::slave(name, store, self.slave_options[i].clone())?;
        Ok(())
    }

    /// Stops each master and starts a new one on its address and data directory.
    pub fn restart_master(&mut self) -> Result<(), Error> {
        for (master, options) in self.masters.iter_mut().zip(&self.master_options) {
            master.stop()?;
            *master = Server::master(options.clone())?;
        }
        Ok(())
    }

    /// Why a server stopped, if one stopped without being asked to.
    pub fn failure(&mut self) -> Option<Error> {
        self.masters
            .iter_mut()
            .chain(&mut self.slaves)
            .find_map(Server::failure)
    }

    /// Stops the masters, then the slaves; the first error one stopped with.
    pub fn stop(mut self) -> Result<(), Error> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Result<(), Error> {
        let mut outcome = Ok(());
        for server in self.masters.iter_mut().chain(&mut self.slaves) {
            outcome = outcome.and(server.stop());
        }
        outcome
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}
