//! bitfold's query layer: the master, the slaves (handler and coordinator),
//! and the client a DBMS links, over Cap'n Proto RPC (`schema/bitfold.capnp`).
//!
//! - [`client::Client`]: a blocking client of the master (query, import,
//!   status), usable from any thread; [`client::LocalClient`], the same
//!   calls run by the calling thread, one per thread.
//! - [`master::run`]: serves the DBMS interface; parses ([`query`]), plans
//!   over its durable [`catalog`] with [`placement`], picks a coordinator,
//!   retries around failed machines.
//! - [`slave::run`]: serves a store's vectors to handler chains and
//!   coordinates queries.
//! - [`cluster::ClusterConfig`]: the cluster file.
//! - [`tls::Tls`]: optional mutual TLS on every link.
//!
//! ```no_run
//! use bitfold_rpc::client::{Answer, Client, Format};
//!
//! let client = Client::connect("127.0.0.1:7100")?;
//! if let Answer::Count(n) = client.query("R:10-19&42", Format::Count)? {
//!     println!("{n} rows");
//! }
//! # Ok::<(), bitfold_rpc::client::Error>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

/// The Rust generated from `schema/bitfold.capnp` by `schema/regen.sh` (do not edit).
#[rustfmt::skip]
#[allow(missing_docs, clippy::all, clippy::pedantic, unused)]
pub mod bitfold_capnp;

mod budget;
pub mod catalog;
mod chain;
pub mod client;
pub mod cluster;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod hop;
pub mod local;
pub mod master;
mod metrics;
mod net;
pub mod placement;
pub mod query;
pub mod slave;
pub mod tls;
mod wire;

pub use net::{MAX_CONNECTIONS_PER_PEER, MAX_MESSAGE_WORDS};

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
}
