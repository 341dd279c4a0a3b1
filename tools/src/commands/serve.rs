//! `bitfold slave` and `bitfold master`: serve in the foreground until killed.

use std::path::Path;

use anyhow::Context;
use bitfold_net::tls::Tls;
use bitfold_server::cluster::{ClusterFile, MasterEntry};
use bitfold_server::master::{self, MasterOptions, Replication};
use bitfold_server::slave::{self, Admit, SlaveOptions};

use crate::cli::{DEFAULT_MASTER, MasterArgs, SlaveArgs};

/// Serves a slave; prints `slave listening on ADDR` once it accepts calls.
pub fn slave(args: SlaveArgs) -> anyhow::Result<()> {
    let mut options = SlaveOptions::new(args.listen, args.data_dir);
    options.metrics = args.metrics;
    options.tls = super::load_tls(args.tls.as_deref())?;
    if let Some(file) = args.cluster {
        options.admit = Admit::File(file);
    }
    slave::run(options, |addr| println!("slave listening on {addr}"))?;
    Ok(())
}

/// Serves the master; prints `master listening on ADDR` once it answers queries.
pub fn master(args: MasterArgs) -> anyhow::Result<()> {
    let ClusterFile {
        cluster,
        tls,
        masters,
        ..
    } = ClusterFile::load(&args.cluster)?;
    let replication = replication(&args, masters)?;
    let listen = match &replication {
        Some(place) => place
            .masters
            .iter()
            .find(|m| m.name == place.name)
            .map(|m| m.addr.clone())
            .expect("the name is one of the entries"),
        None => args
            .listen
            .clone()
            .unwrap_or_else(|| DEFAULT_MASTER.to_owned()),
    };
    let data_dir = args.data_dir.clone().unwrap_or_else(|| match &replication {
        Some(place) => default_master_dir(&args.cluster).join(&place.name),
        None => default_master_dir(&args.cluster),
    });
    let mut options = MasterOptions::new(listen, cluster, data_dir);
    options.replication = replication;
    options.cluster_file = Some(args.cluster.clone());
    options.policy = args.policy;
    options.plan = args.plan;
    options.rpc_timeout = args.rpc_timeout.unwrap_or(options.rpc_timeout);
    options.attempts = args.attempts.unwrap_or(options.attempts);
    options.query_timeout = args.query_timeout.unwrap_or(options.query_timeout);
    options.probe_interval = args.probe_interval.unwrap_or(options.probe_interval);
    options.metrics = args.metrics;
    options.slow = args.slow;
    options.tls = match (&args.tls, tls) {
        (Some(dir), _) => Some(Tls::load(dir)?),
        (None, Some(files)) => {
            let folder = args.cluster.parent().unwrap_or(Path::new("."));
            let tls = Tls::load_files(&files.relative_to(folder)).with_context(|| {
                format!(
                    "cannot use the TLS files the [tls] table of the cluster file {} names \
                     (fix the table, or pass --tls DIR)",
                    args.cluster.display()
                )
            })?;
            Some(tls)
        }
        (None, None) => None,
    };
    master::run(options, |addr| println!("master listening on {addr}"))
        .with_context(|| format!("the master for {} stopped", args.cluster.display()))?;
    Ok(())
}

/// This master's place among the cluster file's `[[masters]]`, if it lists any.
fn replication(
    args: &MasterArgs,
    masters: Vec<MasterEntry>,
) -> anyhow::Result<Option<Replication>> {
    let file = args.cluster.display();
    match (&args.name, masters.is_empty()) {
        (None, true) => Ok(None),
        (None, false) => anyhow::bail!(
            "the cluster file {file} lists [[masters]]: say which one this is with --name \
             (one of {})",
            names(&masters)
        ),
        (Some(name), true) => anyhow::bail!(
            "--name {name}: the cluster file {file} lists no [[masters]]; add them, or start \
             the one master without --name"
        ),
        (Some(name), false) if !masters.iter().any(|m| &m.name == name) => anyhow::bail!(
            "--name {name}: the cluster file {file} lists no such master (it lists {})",
            names(&masters)
        ),
        (Some(name), false) => Ok(Some(Replication {
            name: name.clone(),
            masters,
        })),
    }
}

fn names(masters: &[MasterEntry]) -> String {
    masters
        .iter()
        .map(|m| m.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `master-data` beside the cluster file (with several masters, one
/// folder per master in it) (docs/protocol.md §6).
fn default_master_dir(cluster_file: &Path) -> std::path::PathBuf {
    cluster_file
        .parent()
        .unwrap_or(Path::new("."))
        .join("master-data")
}
