//! One module per command; `run` dispatches.

mod bench;
mod delete;
mod demo;
mod import;
mod index;
mod local;
mod query;
mod rebalance;
mod sample;
mod serve;
mod status;
mod up;

use crate::cli::Command;

/// Runs one command to completion.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Slave(args) => serve::slave(args),
        Command::Master(args) => serve::master(args),
        Command::Up(args) => up::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Import(args) => import::run(args),
        Command::Delete(args) => delete::run(args),
        Command::Query(args) => query::run(args),
        Command::Index(args) => index::run(args),
        Command::Status(args) => status::run(args),
        Command::Rebalance(args) => rebalance::run(args),
        Command::Sample(args) => sample::run(args),
        Command::Bench(args) => bench::run(args),
    }
}
