//! The cluster file and the TLS folders of a local cluster started by `up`,
//! `demo` and `bench` (the cluster itself is
//! [`bitfold_server::local::LocalCluster`]).

use std::path::Path;

use anyhow::{Context, bail};
use bitfold_server::cluster::{ClusterConfig, SlaveEntry};

/// The TLS folders of a local cluster under `dir` ([`bitfold_certs::cluster_set`]):
/// the kept CA in `dir/ca`, `dir/master` and `dir/NAME` for each slave
/// (the folders [`bitfold_server::local::LocalCluster`] reads), and
/// `dir/admin` and `dir/reader` for clients. Where `dir/ca` holds a CA,
/// only the folders missing are issued.
pub fn cluster_tls(
    dir: &Path,
    cluster: &ClusterConfig,
) -> Result<bitfold_certs::ClusterSet, bitfold_certs::Error> {
    let slaves: Vec<&str> = cluster.slaves.iter().map(|s| s.name.as_str()).collect();
    bitfold_certs::cluster_set(dir, &slaves)
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_masters_folder_is_where_the_local_cluster_looks() {
        assert_eq!(bitfold_certs::MASTER, bitfold_server::local::MASTER_TLS);
    }
}
