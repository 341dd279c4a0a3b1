//! `bitfold up`: a whole local cluster in the foreground until Ctrl-C or SIGTERM.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, bail};
use bitfold_rpc::cluster::{ClusterConfig, ClusterFile};
use bitfold_rpc::local::{CLIENT_TLS, LocalCluster, MASTER_TLS, generate_tls};
use bitfold_rpc::tls::Files;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::local::numbered_cluster;
use crate::cli::UpArgs;

/// Starts the cluster described by `args` (or the one already in `--dir`) and serves until stopped.
pub fn run(args: UpArgs) -> anyhow::Result<()> {
    let (signal, signalled) = mpsc::channel();
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("cannot watch for Ctrl-C")?;
    thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = signal.send(());
        }
    });

    fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create the cluster directory {}", args.dir.display()))?;
    let cluster = cluster_for(&args)?;
    let tls = if args.tls {
        Some(tls_for(&args.dir, &cluster)?)
    } else {
        None
    };
    let mut local = LocalCluster::start_tls(
        &args.dir,
        cluster,
        &format!("127.0.0.1:{}", args.port),
        tls.as_deref(),
        |options| {
            options.metrics = args.metrics.clone();
            options.slow = args.slow;
        },
    )?;
    let cluster = local.cluster().clone();

    println!(
        "{} slaves, {} cop{} of every vector, data in {}",
        cluster.slaves.len(),
        cluster.replicas,
        if cluster.replicas == 1 { "y" } else { "ies" },
        args.dir.display()
    );
    for slave in &cluster.slaves {
        println!("slave {} listening on {}", slave.name, slave.addr);
    }
    println!("master listening on {}", local.master_addr());
    if let Some(tls) = &tls {
        println!(
            "mutual TLS on every link; clients pass --tls {}",
            tls.join(CLIENT_TLS).display()
        );
    }
    if let Some(metrics) = &args.metrics {
        println!("master metrics at http://{metrics}/metrics");
    }
    println!("press Ctrl-C to stop");

    loop {
        match signalled.recv_timeout(FAILURE_CHECK_INTERVAL) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(failure) = local.failure() {
                    return Err(failure.into());
                }
            }
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                local.stop()?;
                println!("stopped");
                return Ok(());
            }
        }
    }
}

/// How often the foreground checks that every server still serves.
const FAILURE_CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// Slaves of a new cluster when `--slaves` is not given.
const DEFAULT_SLAVES: usize = 3;

/// The cluster file already in the directory (the flags, if given, must
/// agree with it), or a new one written there.
fn cluster_for(args: &UpArgs) -> anyhow::Result<ClusterConfig> {
    let file = cluster_file(&args.dir);
    if file.exists() {
        let cluster = ClusterConfig::load(&file)?;
        let slaves_differ = args.slaves.is_some_and(|n| n != cluster.slaves.len());
        let replicas_differ = args.replicas.is_some_and(|r| r != cluster.replicas);
        if slaves_differ || replicas_differ {
            bail!(
                "{} describes {} slaves with {} replicas, which --slaves/--replicas contradict: \
                 vectors are placed by that file, so use another --dir for another shape",
                file.display(),
                cluster.slaves.len(),
                cluster.replicas,
            );
        }
        return Ok(cluster);
    }
    let first_slave_port = args
        .port
        .checked_add(1)
        .context("--port must be below 65535")?;
    let cluster = numbered_cluster(
        args.slaves.unwrap_or(DEFAULT_SLAVES),
        args.replicas.unwrap_or(1),
        first_slave_port,
    )?;
    fs::write(&file, cluster.to_toml())
        .with_context(|| format!("cannot write the cluster file {}", file.display()))?;
    Ok(cluster)
}

/// The TLS folders of the cluster under `dir`: those of an earlier run
/// with `--tls`, or new ones. The cluster file gets a `[tls]` table naming
/// the master's, if it has none, so that `bitfold master --cluster` on it
/// runs TLS too.
fn tls_for(dir: &Path, cluster: &ClusterConfig) -> anyhow::Result<PathBuf> {
    let tls = dir.join(TLS_FOLDER);
    if !tls.join(CLIENT_TLS).exists() {
        generate_tls(&tls, cluster)?;
    }
    let path = cluster_file(dir);
    let mut file = ClusterFile::load(&path)?;
    if file.tls.is_none() {
        file.tls = Some(Files::in_folder(&Path::new(TLS_FOLDER).join(MASTER_TLS)));
        fs::write(&path, file.to_toml())
            .with_context(|| format!("cannot write the cluster file {}", path.display()))?;
    }
    Ok(tls)
}

/// The folder under `--dir` that holds the cluster's TLS folders.
const TLS_FOLDER: &str = "tls";

/// The cluster file of the cluster under `dir`.
fn cluster_file(dir: &Path) -> PathBuf {
    dir.join("cluster.toml")
}
