//! What `bitfold bench` shares with the side-by-side comparison in
//! `benches/`: the seeded data set and queries, and the measuring loop.

pub mod harness;
pub mod workload;
