//! bitfold's storage engine: vectors, the bitwise kernels that fold them, and
//! the memory-mapped store that holds a slave's vectors (and the log that
//! holds the master's catalog).
//!
//! This crate knows nothing of the network. Its main types:
//!
//! - [`VectorPart`]: a borrowed vector (or piece of one) as roaring-style
//!   containers, dense ones being plain 64-bit words; [`VectorBuf`] owns one.
//! - [`kernels`]: OR / AND / popcount over words, dispatched to SIMD at run time.
//!
//! ```
//! use bitfold_engine::VectorBuf;
//!
//! let v = VectorBuf::from_bits(vec![3, 1, 1 << 31]);
//! assert_eq!(v.as_part().cardinality(), 3);
//! assert!(v.as_part().contains(1 << 31));
//! ```
#![deny(missing_docs)]

#[cfg(feature = "store")]
pub mod fold;
#[cfg(feature = "store")]
pub mod import;
pub mod kernels;
pub mod mix;
pub mod portable;
mod runs;
#[cfg(feature = "store")]
pub mod store;
pub mod vector;
pub mod words;

pub use vector::{
    CONTAINER_BITS, CONTAINER_WORDS, ContainerRef, DenseContainer, MalformedPart, PART_MAX_DENSE,
    PushError, SPARSE_MAX, VectorBuf, VectorPart,
};

pub use runs::VidRun;
#[cfg(feature = "store")]
pub use store::{ImportStats, Snapshot, Store, StoreError, Update, UpdateStats};
