//! bitfold's table indexer: a CSV table becomes a bitmap index (one vector
//! per value or value bin of each column, the vectors of a column on
//! consecutive vids in value order) and a map of it (`index.toml`); a
//! predicate on the table becomes, through the map, one `R:` range query.
//!
//! This crate knows nothing of the network: it writes vectors as portable
//! Roaring files (with `bitfold-engine`) that `bitfold import` loads.
//!
//! - [`index_file`] / [`index_table`] build an [`Index`] in two passes over
//!   the table; [`Index::write`] writes it.
//! - [`IndexMap`] is the map: [`IndexMap::load`], and
//!   [`IndexMap::translate`] turns a predicate into a [`Translation`].
//!
//! ```
//! use bitfold_index::{Options, index_str};
//!
//! let index = index_str("age,region\n34,North\n41,East\n38,North\n", &Options::default())?;
//! let query = index.map.translate("age >= 35 AND region = 'North'", false)?;
//! // age: vids 0-2 (34, 38, 41); region: vids 3-4 (East, North).
//! assert_eq!(query.message().as_deref(), Some("R:1-2&4"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod bins;
mod build;
mod cell;
mod error;
pub mod map;
pub mod predicate;
mod survey;
mod translate;

pub use bins::Binning;
pub use build::{
    Index, Options, Pass, index_file, index_str, index_table, scan_file, scan_table, vectors_dir,
};
pub use error::IndexError;
pub use map::{Bin, Column, Encoding, IndexMap, MapError};
pub use predicate::{Predicate, PredicateError};
pub use translate::Translation;
