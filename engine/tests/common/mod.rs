//! Helpers shared by the integration tests.

/// The deterministic generator of test data: the same seed gives the same
/// data on every run and machine.
pub use bitfold_engine::mix::SplitMix64 as Rng;
