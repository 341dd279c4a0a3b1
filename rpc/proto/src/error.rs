//! The kinds of error the master answers, which the client reads and the
//! servers write.

use std::fmt;

/// The kinds of error the master answers (docs/protocol.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The query message is malformed; the message gives the byte offset.
    BadQuery,
    /// A point query named a vector that does not exist.
    NotFound,
    /// Some needed vector has no live owner; the failed machines are named.
    Unavailable,
    /// A bug or an unexpected condition in bitfold.
    Internal,
    /// The answer does not fit one Cap'n Proto `Data`; ask for `count` or `roaring`.
    TooLarge,
    /// The caller's certificate does not allow the call; the message names
    /// the role it needs. Nothing was changed.
    Forbidden,
    /// The master called is one of several and does not lead now; the
    /// message names the leader when it knows one. Nothing was done: try
    /// the next master.
    NotLeader,
}

impl ErrorKind {
    /// The kind `kind` on the wire names.
    pub fn from_wire(kind: crate::bitfold_capnp::ErrorKind) -> ErrorKind {
        use crate::bitfold_capnp::ErrorKind as W;
        match kind {
            W::BadQuery => ErrorKind::BadQuery,
            W::NotFound => ErrorKind::NotFound,
            W::Unavailable => ErrorKind::Unavailable,
            W::Internal => ErrorKind::Internal,
            W::TooLarge => ErrorKind::TooLarge,
            W::Forbidden => ErrorKind::Forbidden,
            W::NotLeader => ErrorKind::NotLeader,
        }
    }

    /// This kind as the wire names it.
    pub fn to_wire(self) -> crate::bitfold_capnp::ErrorKind {
        use crate::bitfold_capnp::ErrorKind as W;
        match self {
            ErrorKind::BadQuery => W::BadQuery,
            ErrorKind::NotFound => W::NotFound,
            ErrorKind::Unavailable => W::Unavailable,
            ErrorKind::Internal => W::Internal,
            ErrorKind::TooLarge => W::TooLarge,
            ErrorKind::Forbidden => W::Forbidden,
            ErrorKind::NotLeader => W::NotLeader,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::BadQuery => "bad query",
            ErrorKind::NotFound => "not found",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal error",
            ErrorKind::TooLarge => "too large",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::NotLeader => "not the leader",
        })
    }
}
