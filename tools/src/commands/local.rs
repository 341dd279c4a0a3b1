//! A whole cluster in this process: N slaves and a master, each serving on
//! its own thread on loopback. Used by `up`, `demo` and `bench`; the cluster
//! lives as long as the process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, bail};
use bitfold_rpc::cluster::{ClusterConfig, SlaveEntry};
use bitfold_rpc::master::{self, CoordinatorPolicy, MasterOptions};
use bitfold_rpc::slave::{self, SlaveOptions};

/// How long a server may take to start listening (opening a big store included).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running local cluster.
pub struct LocalCluster {
    /// Where the master answers.
    pub master: SocketAddr,
    /// The cluster file the master was started with.
    pub cluster: ClusterConfig,
}

/// Why a local cluster should stop.
pub enum Stop {
    /// Ctrl-C or SIGTERM.
    Signal,
    /// A server stopped after it had started.
    Failed(anyhow::Error),
}

/// Where the pieces of a local cluster live under its directory.
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// The layout under `root`.
    pub fn new(root: &Path) -> Self {
        Layout {
            root: root.to_path_buf(),
        }
    }

    /// The cluster file.
    pub fn cluster_file(&self) -> PathBuf {
        self.root.join("cluster.toml")
    }

    /// The data directory of slave `name`.
    pub fn slave_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// The master's data directory.
    pub fn master_dir(&self) -> PathBuf {
        self.root.join("master-data")
    }
}

impl LocalCluster {
    /// Starts the slaves of `cluster` (listening on their configured
    /// addresses) and a master on `master_listen` picking coordinators by
    /// `policy`, with data under `layout`. A server that fails after
    /// starting is reported on `stops`.
    pub fn start(
        layout: &Layout,
        cluster: ClusterConfig,
        master_listen: &str,
        policy: CoordinatorPolicy,
        stops: &mpsc::Sender<Stop>,
    ) -> anyhow::Result<LocalCluster> {
        let mut bound = Vec::with_capacity(cluster.slaves.len());
        for entry in &cluster.slaves {
            let options = SlaveOptions::new(entry.addr.clone(), layout.slave_dir(&entry.name));
            let what = format!("slave {}", entry.name);
            let addr = spawn_server(&what, stops.clone(), move |ready| {
                slave::run(options, ready).map_err(anyhow::Error::from)
            })?;
            bound.push(SlaveEntry {
                name: entry.name.clone(),
                addr: addr.to_string(),
            });
        }
        let cluster = ClusterConfig {
            group: bitfold_rpc::cluster::DEFAULT_GROUP,
            replicas: cluster.replicas,
            slaves: bound,
        };
        let mut options = MasterOptions::new(
            master_listen.to_string(),
            cluster.clone(),
            layout.master_dir(),
        );
        options.policy = policy;
        let master = spawn_server("the master", stops.clone(), move |ready| {
            master::run(options, ready).map_err(anyhow::Error::from)
        })?;
        Ok(LocalCluster { master, cluster })
    }
}

/// A cluster file for `count` slaves named s0, s1, ... on consecutive ports
/// from `first_port` (0: each picks a free port when it starts).
pub fn numbered_cluster(
    count: usize,
    replicas: usize,
    first_port: u16,
) -> anyhow::Result<ClusterConfig> {
    if count == 0 {
        bail!("a cluster needs at least one slave");
    }
    if replicas == 0 || replicas > count {
        bail!("--replicas must be between 1 and the number of slaves ({count}), not {replicas}");
    }
    let slaves = (0..count)
        .map(|i| {
            let port = if first_port == 0 {
                0
            } else {
                u32::from(first_port) + i as u32
            };
            let port = u16::try_from(port).with_context(|| {
                format!("slave s{i} would need port {port}, above 65535: pick a lower --port")
            })?;
            Ok(SlaveEntry {
                name: format!("s{i}"),
                addr: format!("127.0.0.1:{port}"),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(ClusterConfig {
        replicas,
        group: bitfold_rpc::cluster::DEFAULT_GROUP,
        slaves,
    })
}

/// Runs `serve` on its own thread and waits until it reports the address it
/// listens on, or fails; a failure after that goes to `stopped`.
fn spawn_server(
    what: &str,
    stops: mpsc::Sender<Stop>,
    serve: impl FnOnce(Box<dyn FnOnce(SocketAddr) + Send>) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<SocketAddr> {
    let (tx, rx) = mpsc::channel::<anyhow::Result<SocketAddr>>();
    let ready_tx = tx.clone();
    let name = what.to_string();
    thread::Builder::new()
        .name(what.to_string())
        .spawn(move || {
            let ready = Box::new(move |addr| {
                let _ = ready_tx.send(Ok(addr));
            });
            let outcome: anyhow::Result<()> = serve(ready)
                .and_then(|()| Err(anyhow::anyhow!("stopped serving")))
                .with_context(|| format!("{name} stopped"));
            if let Err(err) = outcome {
                // Before start-up completes the waiting caller gets it; after, `stopped` does.
                if let Err(mpsc::SendError(Err(err))) = tx.send(Err(err)) {
                    let _ = stops.send(Stop::Failed(err));
                }
            }
        })
        .with_context(|| format!("cannot start a thread for {what}"))?;
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok(addr)) => Ok(addr),
        Ok(Err(err)) => Err(err),
        Err(_) => bail!(
            "{what} did not start listening within {}s",
            START_TIMEOUT.as_secs()
        ),
    }
}
