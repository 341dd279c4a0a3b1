//! The cluster file of a local cluster started by `up`, `demo` and `bench`
//! (the cluster itself is [`bitfold_server::local::LocalCluster`]).

use anyhow::{Context, bail};
use bitfold_server::cluster::{ClusterConfig, SlaveEntry};

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
        slaves,
    })
}
