//! bitfold's protocol, shared by the client and the servers: the code
//! generated from `schema/bitfold.capnp` ([`bitfold_capnp`]), vectors on the
//! wire ([`wire`]) and in a write ([`writes`]), the query grammar
//! ([`query`]), chains and their failed machines ([`chain`]), hop reports
//! ([`hop`]), time budgets ([`budget`]), the error kinds ([`ErrorKind`])
//! and the limits every reader applies ([`MAX_MESSAGE_WORDS`]). No runtime
//! and no network: what runs the protocol is `bitfold-net`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use capnp::message::ReaderOptions;

/// The Rust generated from `schema/bitfold.capnp` by `schema/regen.sh` (do not edit).
#[rustfmt::skip]
#[allow(missing_docs, clippy::all, clippy::pedantic, unused)]
pub mod bitfold_capnp;

pub mod budget;
pub mod chain;
mod error;
pub mod hop;
pub mod names;
pub mod query;
pub mod wire;
pub mod writes;

pub use error::ErrorKind;

/// The largest message read, in 8-byte words (1 GiB): a vector with every
/// bit set is 512 MiB of dense words in parts, plus its keys.
pub const MAX_MESSAGE_WORDS: usize = 1 << 27;

/// Reader options for every connection, both ends.
pub fn reader_options() -> ReaderOptions {
    let mut options = ReaderOptions::new();
    options.traversal_limit_in_words(Some(MAX_MESSAGE_WORDS));
    options
}
