//! bitfold's range-query workload, shared by `bitfold bench` and the
//! side-by-side comparison with other systems (in `bitfold-benches`):
//!
//! - [`dataset`]: the data set and the queries, generated from a seed, the
//!   same on every run and for every system measured;
//! - [`harness`]: the loop that runs a list of queries against one system
//!   from several client threads and measures it.
//!
//! ```
//! use bitfold_workload::dataset::{DataSet, Shape, queries};
//!
//! let set = DataSet { vectors: 8, bits: 1 << 16, density: 0.5, seed: 7, first_vid: 100 };
//! let shape = Shape { terms: 2, vids_per_term: 3 };
//! let list = queries(set.vids().len(), shape, 5, 7).unwrap();
//! assert!(list[0].message(&set.vids()).starts_with("R:1"));
//! ```
#![deny(missing_docs)]

pub mod dataset;
pub mod harness;
