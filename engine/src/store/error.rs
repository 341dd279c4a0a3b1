//! What can go wrong in a store, each error naming the file and the fix.
//!
//! A message carries the text of its cause (the operating system's error,
//! the failed compaction), so no variant returns a cause from `source()`:
//! whoever prints the chain prints each cause once.

use std::io;
use std::path::PathBuf;

/// An error of the store. Every variant names the file concerned.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed (disk full, permissions, a vanished directory).
    #[error("cannot {action} {}: {cause}", path.display())]
    Io {
        /// What was being done ("create", "write", "sync", ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error (part of the message, not a `source()`).
        cause: io::Error,
    },
    /// A data file failed a check: truncated, checksum mismatch, bad structure.
    #[error(
        "{} is corrupt: {problem}; bitfold will not serve a damaged file: restore the data \
         directory from a backup or a replica, or move it aside and import the data again",
        path.display()
    )]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A file that must be there is not.
    #[error(
        "{} is missing, but {reason}: restore the data directory from a backup or a replica",
        path.display()
    )]
    Missing {
        /// The missing file.
        path: PathBuf,
        /// Why it must exist.
        reason: String,
    },
    /// A file written by a bitfold with another format version.
    #[error(
        "{} has format version {found}, but this bitfold reads version {supported}: \
         open it with the bitfold that wrote it",
        path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version the file declares.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// Another process has the data directory open.
    #[error(
        "data directory {} is in use by another bitfold process (it holds the lock on {}): \
         stop that process or choose another directory",
        dir.display(),
        lock.display()
    )]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// Merging segments after an import failed; the imported batch itself is durable.
    #[error("the batch was stored durably, but merging segments afterwards failed: {0}")]
    Compaction(Box<StoreError>),
}

impl StoreError {
    /// Whether this is a file operation on a file that is not there (a
    /// deletion of one already deleted, say).
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::Io { cause, .. } if cause.kind() == io::ErrorKind::NotFound)
    }

    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, cause: io::Error) -> Self {
        StoreError::Io {
            action,
            path: path.into(),
            cause,
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        StoreError::Corrupt {
            path: path.into(),
            problem: problem.into(),
        }
    }
}
