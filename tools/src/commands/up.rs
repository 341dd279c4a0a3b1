//! `bitfold up`: a whole local cluster in the foreground until Ctrl-C or SIGTERM.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, bail};
use bitfold_net::tls::{Files, SERVER_NAME};
use bitfold_server::cluster::{ClusterConfig, ClusterFile, MasterEntry};
use bitfold_server::local::{LocalCluster, MASTER_TLS};
use bitfold_server::master::MasterOptions;
use bitfold_server::slave::SlaveOptions;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::local::{cluster_tls, numbered_cluster};
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
    let ClusterFile {
        cluster, masters, ..
    } = cluster_for(&args)?;
    let tls = if args.tls {
        Some(tls_for(&args.dir, &cluster)?)
    } else {
        None
    };
    let servers = masters.len().max(1);
    let metrics = match &args.metrics {
        Some(first) => metrics_addrs(first, servers, cluster.slaves.len())?,
        None => Vec::new(),
    };
    let tune_slave =
        |i, options: &mut SlaveOptions| options.metrics = metrics.get(servers + i).cloned();
    let tune = |options: &mut MasterOptions| {
        let i = options
            .replication
            .as_ref()
            .and_then(|place| masters.iter().position(|m| m.name == place.name))
            .unwrap_or(0);
        options.metrics = metrics.get(i).cloned();
        options.slow = args.slow;
    };
    let mut local = if masters.is_empty() {
        let listen = format!("127.0.0.1:{}", args.port);
        LocalCluster::start_tuned(
            &args.dir,
            cluster,
            &listen,
            tls.as_deref(),
            tune_slave,
            tune,
        )?
    } else {
        LocalCluster::start_replicated(
            &args.dir,
            cluster,
            &masters,
            tls.as_deref(),
            tune_slave,
            tune,
        )?
    };
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
    if masters.is_empty() {
        println!("master listening on {}", local.master_addr());
    } else {
        for (master, addr) in masters.iter().zip(local.master_addrs()) {
            println!("master {} listening on {addr}", master.name);
        }
        let all: Vec<String> = local.master_addrs().iter().map(|a| a.to_string()).collect();
        println!(
            "{} masters replicate their records (Raft): clients pass --master {}",
            masters.len(),
            all.join(",")
        );
    }
    if let Some(tls) = &tls {
        println!(
            "mutual TLS on every link; clients pass --tls {} (any command) or --tls {} \
             (queries only); `bitfold certs list --ca {}` lists the certificates",
            tls.join(bitfold_certs::ADMIN).display(),
            tls.join(bitfold_certs::READER).display(),
            tls.join(bitfold_certs::CLUSTER_CA).display(),
        );
    }
    if !metrics.is_empty() {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let (of_masters, slaves) = metrics.split_at(servers);
        for addr in of_masters {
            println!("master metrics at {scheme}://{addr}/metrics");
        }
        for (slave, addr) in cluster.slaves.iter().zip(slaves) {
            println!("slave {} metrics at {scheme}://{addr}/metrics", slave.name);
        }
        if let Some(tls) = &tls {
            println!(
                "metrics need a client certificate of the cluster's CA: scrape with {}'s \
                 ca.pem, cert.pem and key.pem, server name {SERVER_NAME}",
                tls.join(bitfold_certs::READER).display()
            );
        }
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
/// agree with it), or a new one written there. With one master, its
/// `master` key names the address the master listens on; with several,
/// its `[[masters]]` do.
fn cluster_for(args: &UpArgs) -> anyhow::Result<ClusterFile> {
    let file = cluster_file(&args.dir);
    let mut whole = if file.exists() {
        let whole = ClusterFile::load(&file)?;
        let cluster = &whole.cluster;
        let slaves_differ = args.slaves.is_some_and(|n| n != cluster.slaves.len());
        let replicas_differ = args.replicas.is_some_and(|r| r != cluster.replicas);
        let masters_differ = args
            .masters
            .is_some_and(|m| m != whole.masters.len().max(1));
        if slaves_differ || replicas_differ || masters_differ {
            bail!(
                "{} describes {} slaves with {} replicas and {} master(s), which \
                 --slaves/--replicas/--masters contradict: vectors and records are placed by \
                 that file, so use another --dir for another shape",
                file.display(),
                cluster.slaves.len(),
                cluster.replicas,
                whole.masters.len().max(1),
            );
        }
        whole
    } else {
        let masters = args.masters.unwrap_or(1);
        if ![1, 3, 5].contains(&masters) {
            bail!("--masters {masters}: run 1, 3 or 5 masters");
        }
        let port = |i: usize| {
            u16::try_from(i)
                .ok()
                .and_then(|i| args.port.checked_add(i))
                .with_context(|| format!("--port {}: too high for the ports after it", args.port))
        };
        let cluster = numbered_cluster(
            args.slaves.unwrap_or(DEFAULT_SLAVES),
            args.replicas.unwrap_or(1),
            port(masters)?,
        )?;
        let masters = if masters == 1 {
            Vec::new()
        } else {
            (0..masters)
                .map(|i| {
                    Ok(MasterEntry {
                        name: format!("m{i}"),
                        addr: format!("127.0.0.1:{}", port(i)?),
                    })
                })
                .collect::<anyhow::Result<_>>()?
        };
        ClusterFile {
            cluster,
            master: None,
            tls: None,
            masters,
        }
    };
    let master = whole
        .masters
        .is_empty()
        .then(|| format!("127.0.0.1:{}", args.port));
    if whole.master != master || !file.exists() {
        whole.master = master;
        fs::write(&file, whole.to_toml())
            .with_context(|| format!("cannot write the cluster file {}", file.display()))?;
    }
    Ok(whole)
}

/// The TLS folders of the cluster under `dir`: those of an earlier run
/// with `--tls` (with a folder issued by its kept CA for each slave added
/// since), or new ones. The cluster file gets a `[tls]` table naming the
/// master's, if it has none, so that `bitfold master --cluster` on it runs
/// TLS too.
fn tls_for(dir: &Path, cluster: &ClusterConfig) -> anyhow::Result<PathBuf> {
    let tls = dir.join(TLS_FOLDER);
    let set = cluster_tls(&tls, cluster)?;
    if !set.new_ca {
        for issued in &set.issued {
            println!(
                "issued {} certificate for {} in {}, valid until {}, from the CA kept in {}",
                issued.role.with_article(),
                issued.name,
                issued.folder.display(),
                bitfold_certs::utc(issued.not_after),
                tls.join(bitfold_certs::CLUSTER_CA).display()
            );
        }
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

/// Where each server serves its metrics, given `--metrics HOST:PORT`:
/// master `i` of `masters` at `HOST:(PORT + i)`, then slave `i` (in cluster
/// file order) at `HOST:(PORT + masters + i)`.
fn metrics_addrs(first: &str, masters: usize, slaves: usize) -> anyhow::Result<Vec<String>> {
    let (host, port) = first
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
        .with_context(|| format!("--metrics {first}: give HOST:PORT, e.g. 127.0.0.1:9100"))?;
    if port == 0 {
        bail!(
            "--metrics {first}: `bitfold up` needs a fixed port, since its slaves serve \
             their metrics on the ports after it"
        );
    }
    (0..masters + slaves)
        .map(|i| {
            let port = u16::try_from(i)
                .ok()
                .and_then(|i| port.checked_add(i))
                .with_context(|| {
                    format!(
                        "--metrics {first}: {slaves} slaves need the ports after it; pick a \
                         lower one"
                    )
                })?;
            Ok(format!("{host}:{port}"))
        })
        .collect()
}

/// The folder under `--dir` that holds the cluster's TLS folders.
const TLS_FOLDER: &str = "tls";

/// The cluster file of the cluster under `dir`.
fn cluster_file(dir: &Path) -> PathBuf {
    dir.join("cluster.toml")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_slave_serves_metrics_on_a_port_after_the_masters() {
        let addrs = metrics_addrs("127.0.0.1:9100", 1, 3).unwrap();
        assert_eq!(
            addrs,
            [
                "127.0.0.1:9100",
                "127.0.0.1:9101",
                "127.0.0.1:9102",
                "127.0.0.1:9103"
            ]
        );
    }

    #[test]
    fn a_metrics_port_that_leaves_no_room_for_the_slaves_is_refused() {
        let err = metrics_addrs("127.0.0.1:65534", 1, 3)
            .unwrap_err()
            .to_string();
        assert!(err.contains("pick a lower one"), "{err}");
        let err = metrics_addrs("127.0.0.1:0", 1, 3).unwrap_err().to_string();
        assert!(err.contains("needs a fixed port"), "{err}");
        let err = metrics_addrs("9100", 1, 3).unwrap_err().to_string();
        assert!(err.contains("give HOST:PORT"), "{err}");
    }
}
