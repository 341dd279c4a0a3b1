//! The errors a call returns; the kinds of error the master answers are
//! [`bitfold_proto::ErrorKind`].

use std::fmt;

use crate::bitfold_capnp::error;

pub use bitfold_proto::ErrorKind;

/// Why a call failed. `Display` is one line a user can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The master answered with an error.
    #[error("{message}")]
    Query {
        /// What kind of error.
        kind: ErrorKind,
        /// The master's message (`bad query at byte 5: expected a digit after '-'`).
        message: String,
        /// The machines that failed or are down, for `Unavailable`.
        failed_machines: Vec<String>,
    },
    /// The master could not be reached.
    #[error("cannot reach the master at {addr}: {reason}")]
    Connect {
        /// The master's address.
        addr: String,
        /// Why (connection refused, no answer in time, ...) and what to do.
        reason: String,
    },
    /// The master's answer made no sense (a version mismatch or a bug).
    #[error("unexpected answer from the master: {0}")]
    Protocol(String),
    /// A [`LocalClient`](super::LocalClient) was called on a thread that
    /// runs an async runtime: the call would block the runtime's thread.
    #[error(
        "a LocalClient cannot be called from inside an async runtime (its calls block the \
         thread): use a Client, whose calls run on a thread of its own"
    )]
    InsideRuntime,
}

/// What [`Error::unreachable`] adds to the reason: the fix.
pub(crate) const START_HINT: &str = " (start it with `bitfold up`)";

impl Error {
    /// A master that did not answer at `addr`: the fix is to start it.
    pub(super) fn unreachable(addr: &str, why: impl fmt::Display) -> Error {
        Error::Connect {
            addr: addr.to_owned(),
            reason: format!("{why}{START_HINT}"),
        }
    }

    /// An answer of the master's that does not read.
    pub(crate) fn unreadable(err: capnp::Error) -> Error {
        Error::Protocol(err.to_string())
    }

    pub(crate) fn read(reader: error::Reader<'_>) -> Error {
        let text = |t: capnp::Result<capnp::text::Reader<'_>>| {
            t.ok()
                .and_then(|t| t.to_str().ok())
                .unwrap_or("?")
                .to_owned()
        };
        let failed_machines = match reader.get_failed_machines() {
            Ok(list) => list.iter().map(&text).collect(),
            Err(_) => Vec::new(),
        };
        match reader.get_kind() {
            Ok(kind) => Error::Query {
                kind: ErrorKind::from_wire(kind),
                message: text(reader.get_message()),
                failed_machines,
            },
            Err(_) => Error::Protocol("an error of an unknown kind".into()),
        }
    }

    /// The kind of a query error, if the master answered one.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Error::Query { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}
