//! bitfold as the comparison runs it: slaves and a master serving on
//! loopback from threads of this process (as `bitfold bench` and
//! `bitfold up` run them), stopped when dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, anyhow};
use bitfold_rpc::cluster::{ClusterConfig, SlaveEntry};
use bitfold_rpc::master::{self, CoordinatorPolicy, MasterOptions};
use bitfold_rpc::slave::{self, SlaveOptions};
use futures::channel::oneshot;

/// A server thread and the switch that stops it.
struct Server {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs `serve(ready, stop)` on a thread named `name` and waits for its address.
fn spawn<F>(name: &str, serve: F) -> anyhow::Result<(Server, SocketAddr)>
where
    F: FnOnce(
            Box<dyn FnOnce(SocketAddr) + Send>,
            oneshot::Receiver<()>,
        ) -> Result<(), bitfold_rpc::Error>
        + Send
        + 'static,
{
    let (ready, addr) = mpsc::channel();
    let (stop, stopped) = oneshot::channel();
    let what = name.to_owned();
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let ready_tx = ready.clone();
            if let Err(err) = serve(Box::new(move |addr| drop(ready_tx.send(Ok(addr)))), stopped) {
                let _ = ready.send(Err(anyhow!("{what} stopped: {err}")));
            }
        })?;
    let server = Server {
        stop: Some(stop),
        thread: Some(thread),
    };
    let addr = addr
        .recv_timeout(Duration::from_secs(60))
        .with_context(|| format!("{name} did not start"))??;
    Ok((server, addr))
}

/// A running cluster; dropping it stops every server.
pub struct Cluster {
    /// Where the master answers.
    pub master: String,
    // Master first, so that it stops before its slaves.
    _servers: Vec<Server>,
}

impl Cluster {
    /// `slaves` slaves (data under `dir`) and a master picking coordinators by `policy`.
    pub fn start(dir: &Path, slaves: usize, policy: CoordinatorPolicy) -> anyhow::Result<Cluster> {
        let mut servers = Vec::new();
        let mut entries = Vec::new();
        for i in 0..slaves {
            let options = SlaveOptions::new("127.0.0.1:0", dir.join(format!("s{i}")));
            let (server, addr) = spawn(&format!("slave s{i}"), move |ready, stop| {
                slave::run_until(options, ready, async {
                    let _ = stop.await;
                })
            })?;
            servers.push(server);
            entries.push(SlaveEntry {
                name: format!("s{i}"),
                addr: addr.to_string(),
            });
        }
        let config = ClusterConfig {
            group: bitfold_rpc::cluster::DEFAULT_GROUP,
            replicas: 1,
            slaves: entries,
        };
        let mut options = MasterOptions::new("127.0.0.1:0", config, dir.join("master"));
        options.policy = policy;
        let (server, addr) = spawn("the master", move |ready, stop| {
            master::run_until(options, ready, async {
                let _ = stop.await;
            })
        })?;
        servers.insert(0, server);
        Ok(Cluster {
            master: addr.to_string(),
            _servers: servers,
        })
    }
}
