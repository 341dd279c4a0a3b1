//! How a master serves: [`MasterOptions`].

use std::path::PathBuf;
use std::time::Duration;

use super::{CoordinatorPolicy, PlanChoice};
use crate::cluster::{ClusterConfig, MasterEntry};
use crate::query::Limits;
use crate::tls::Tls;

/// How a master serves.
#[derive(Debug, Clone)]
pub struct MasterOptions {
    /// Where to listen, `HOST:PORT` (port 0 picks a free one).
    pub listen: String,
    /// The slaves and the number of replicas.
    pub cluster: ClusterConfig,
    /// The cluster file `cluster` was read from, which `rebalance` reads
    /// again (docs/protocol.md §9); without one, `rebalance` moves vectors
    /// to `cluster`.
    pub cluster_file: Option<PathBuf>,
    /// Where the catalog lives (created if missing).
    pub data_dir: PathBuf,
    /// How the coordinator of a query is picked.
    pub policy: CoordinatorPolicy,
    /// How the coordinator gathers the term vectors: chains, fan-out, or
    /// the cheaper by the cost model (default).
    pub plan: PlanChoice,
    /// The longest one attempt (a coordinate or fetch call with everything
    /// under it) may take (default 5 s).
    pub rpc_timeout: Duration,
    /// How many times a query is planned and tried (default 3).
    pub attempts: u32,
    /// Every query is answered or failed within this (default 30 s).
    pub query_timeout: Duration,
    /// How often a down slave is probed (default 1 s).
    pub probe_interval: Duration,
    /// The longest an import may wait for an owner that is up (default 30 s;
    /// an owner already marked down gets `rpc_timeout`).
    pub import_timeout: Duration,
    /// Size limits on query messages.
    pub limits: Limits,
    /// The most existing vectors the terms of one query may hold in all
    /// (default 2^24: the chains of a query travel in one message).
    pub max_query_vectors: usize,
    /// Where to serve Prometheus metrics at `/metrics`, `HOST:PORT` (none by default).
    pub metrics: Option<String>,
    /// A query taking at least this long is logged once with its plan
    /// (none by default).
    pub slow: Option<Duration>,
    /// Mutual TLS on every link, from the DBMS and to the slaves (none by
    /// default: plain TCP).
    pub tls: Option<Tls>,
    /// This master's place among several whose records Raft replicates
    /// (none by default: the one master).
    pub replication: Option<Replication>,
}

/// A master's place among several (the cluster file's `[[masters]]`).
#[derive(Debug, Clone)]
pub struct Replication {
    /// This master's name.
    pub name: String,
    /// Every master, this one included.
    pub masters: Vec<MasterEntry>,
}

impl MasterOptions {
    /// Options with the defaults for everything but the address, cluster and directory.
    pub fn new(
        listen: impl Into<String>,
        cluster: ClusterConfig,
        data_dir: impl Into<PathBuf>,
    ) -> MasterOptions {
        MasterOptions {
            listen: listen.into(),
            cluster,
            cluster_file: None,
            data_dir: data_dir.into(),
            policy: CoordinatorPolicy::default(),
            plan: PlanChoice::default(),
            rpc_timeout: Duration::from_secs(5),
            attempts: 3,
            query_timeout: Duration::from_secs(30),
            probe_interval: Duration::from_secs(1),
            import_timeout: Duration::from_secs(30),
            limits: Limits::default(),
            max_query_vectors: 1 << 24,
            metrics: None,
            slow: None,
            tls: None,
            replication: None,
        }
    }

    /// How long a health call may take: short, so status stays quick.
    pub(super) fn health_timeout(&self) -> Duration {
        self.rpc_timeout.min(Duration::from_secs(2))
    }
}
