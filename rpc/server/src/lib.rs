//! bitfold's servers, over Cap'n Proto RPC (`schema/bitfold.capnp`): the
//! master, the slaves (handler and coordinator) and the local cluster. The
//! client a DBMS links is `bitfold-client`; the protocol both share is
//! `bitfold-proto`, the transport `bitfold-net`.
//!
//! - [`master::run`]: serves the DBMS interface; parses
//!   ([`bitfold_proto::query`]), plans over its durable [`catalog`] with
//!   [`placement`], picks a coordinator, retries around failed machines.
//! - [`slave::run`]: serves a store's vectors to handler chains and
//!   coordinates queries.
//! - [`cluster::ClusterConfig`]: the cluster file.
//! - [`local::LocalCluster`]: a master and slaves in this process (`bitfold up`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use bitfold_net::{self as net, tls};
use bitfold_proto::{bitfold_capnp, budget, chain, hop, query};
use tokio::net::TcpListener;

mod access;
pub mod catalog;
pub mod cluster;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod local;
pub mod master;
mod metrics;
pub mod pieces;
pub mod placement;
pub mod slave;
mod wire;

/// Why a master or slave could not start or stopped serving.
///
/// Each message carries its cause's text, and no variant returns a cause
/// from `source()` (the wrapping variants are transparent), so a caller that
/// prints the chain prints each cause once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {cause} (is another server using that port?)")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The underlying error (part of the message, not a `source()`).
        cause: std::io::Error,
    },
    /// The metrics address (`--metrics`) could not be bound.
    #[error("cannot serve metrics on {addr}: {cause} (is another server using that port?)")]
    MetricsBind {
        /// The address asked for.
        addr: String,
        /// The underlying error (part of the message, not a `source()`).
        cause: std::io::Error,
    },
    /// The runtime or a socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The cluster configuration is not usable.
    #[error("invalid cluster configuration: {0}")]
    Config(String),
    /// The master's catalog could not be opened (its cause is part of the
    /// message, not a `source()`).
    #[error(
        "cannot open the master's catalog: {0} (if it is damaged, moving it away makes the \
         master rebuild it from what the slaves hold)"
    )]
    Catalog(bitfold_engine::store::StoreError),
    /// The slave's store could not be opened.
    #[error(transparent)]
    Store(#[from] bitfold_engine::store::StoreError),
    /// The process's TLS certificate is not one of its role.
    #[error(
        "the certificate {} is {identity}, not a {needs}'s: give this {needs} a certificate of \
         its own (`bitfold certs issue --role {needs}`)",
        cert.display()
    )]
    WrongRole {
        /// The certificate file.
        cert: std::path::PathBuf,
        /// Who it says its holder is.
        identity: Box<tls::Identity>,
        /// The role the process needs.
        needs: tls::Role,
    },
}

/// Binds `listen` as [`net::bind`] does; a failure names the address.
async fn bind(listen: &str) -> Result<TcpListener, Error> {
    net::bind(listen).await.map_err(|cause| Error::Bind {
        addr: listen.to_owned(),
        cause,
    })
}

/// The address a listener is bound to, for `on_ready`.
fn local_addr(listener: &TcpListener) -> Result<std::net::SocketAddr, Error> {
    listener.local_addr().map_err(Error::Io)
}
