//! The cluster file and the TLS folders of a local cluster started by `up`,
//! `demo` and `bench` (the cluster itself is
//! [`bitfold_server::local::LocalCluster`]).

use std::path::Path;

use anyhow::{Context, bail};
use bitfold_server::cluster::{ClusterConfig, SlaveEntry};
use bitfold_server::local::MASTER_TLS;

/// The TLS folder of a DBMS or `bitfold` command, among those [`generate_tls`] writes.
pub const CLIENT_TLS: &str = "client";

/// Writes a new cluster CA to `dir/ca.pem` and a TLS folder signed by it
/// for each process of `cluster`: `dir/master`, `dir/NAME` for each slave,
/// and `dir/client` for the DBMS and the `bitfold` commands.
pub fn generate_tls(dir: &Path, cluster: &ClusterConfig) -> Result<(), bitfold_certs::Error> {
    let names: Vec<&str> = [MASTER_TLS, CLIENT_TLS]
        .into_iter()
        .chain(cluster.slaves.iter().map(|s| s.name.as_str()))
        .collect();
    bitfold_certs::generate(dir, &names)
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
        group: bitfold_server::cluster::DEFAULT_GROUP,
        piece: bitfold_server::pieces::DEFAULT_PIECE,
        slaves,
    })
}
