//! bitfold's query layer.
#![deny(missing_docs)]

#[allow(missing_docs, clippy::all, clippy::pedantic, unused)]
pub mod bitfold_capnp;
