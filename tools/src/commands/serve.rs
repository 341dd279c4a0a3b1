//! `bitfold slave` and `bitfold master`: serve in the foreground until killed.

use std::path::Path;

use anyhow::Context;
use bitfold_net::tls::Tls;
use bitfold_server::cluster::ClusterFile;
use bitfold_server::master::{self, MasterOptions};
use bitfold_server::slave::{self, Admit, SlaveOptions};

use crate::cli::{MasterArgs, SlaveArgs};

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
    let ClusterFile { cluster, tls, .. } = ClusterFile::load(&args.cluster)?;
    let data_dir = args
        .data_dir
        .unwrap_or_else(|| default_master_dir(&args.cluster));
    let mut options = MasterOptions::new(args.listen, cluster, data_dir);
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

/// `master-data` beside the cluster file (docs/protocol.md §6).
fn default_master_dir(cluster_file: &Path) -> std::path::PathBuf {
    cluster_file
        .parent()
        .unwrap_or(Path::new("."))
        .join("master-data")
}
