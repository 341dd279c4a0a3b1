//! `bitfold up`: a whole local cluster in the foreground until Ctrl-C or SIGTERM.

use std::fs;
use std::sync::mpsc;
use std::thread;

use anyhow::{Context, bail};
use bitfold_rpc::cluster::ClusterConfig;
use bitfold_rpc::master::CoordinatorPolicy;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::local::{Layout, LocalCluster, Stop, numbered_cluster};
use crate::cli::UpArgs;

/// Starts the cluster described by `args` (or the one already in `--dir`) and serves until stopped.
pub fn run(args: UpArgs) -> anyhow::Result<()> {
    let (stops, stopped) = mpsc::channel();
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("cannot watch for Ctrl-C")?;
    let signal_stops = stops.clone();
    thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = signal_stops.send(Stop::Signal);
        }
    });

    fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create the cluster directory {}", args.dir.display()))?;
    let layout = Layout::new(&args.dir);
    let cluster = cluster_for(&args, &layout)?;
    let local = LocalCluster::start(
        &layout,
        cluster,
        &format!("127.0.0.1:{}", args.port),
        CoordinatorPolicy::default(),
        &stops,
    )?;

    println!(
        "{} slaves, {} cop{} of every vector, data in {}",
        local.cluster.slaves.len(),
        local.cluster.replicas,
        if local.cluster.replicas == 1 {
            "y"
        } else {
            "ies"
        },
        args.dir.display()
    );
    for slave in &local.cluster.slaves {
        println!("slave {} listening on {}", slave.name, slave.addr);
    }
    println!("master listening on {}", local.master);
    println!("press Ctrl-C to stop");

    match stopped.recv() {
        Ok(Stop::Failed(err)) => Err(err),
        Ok(Stop::Signal) | Err(_) => {
            println!("stopped");
            Ok(())
        }
    }
}

/// Slaves of a new cluster when `--slaves` is not given.
const DEFAULT_SLAVES: usize = 3;

/// The cluster file already in the directory (the flags, if given, must
/// agree with it), or a new one written there.
fn cluster_for(args: &UpArgs, layout: &Layout) -> anyhow::Result<ClusterConfig> {
    let file = layout.cluster_file();
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
