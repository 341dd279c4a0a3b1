//! One module per command; `run` dispatches.

mod bench;
mod certs;
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

use std::path::Path;

use bitfold_client::Client;
use bitfold_net::tls::Tls;

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
        Command::Certs(args) => certs::run(args),
    }
}

/// The TLS folder `--tls` names, read; none without `--tls`.
pub fn load_tls(dir: Option<&Path>) -> anyhow::Result<Option<Tls>> {
    Ok(dir.map(Tls::load).transpose()?)
}

/// A client of the master at `addr`, over mutual TLS with the folder `tls`.
pub fn connect(addr: &str, tls: Option<&Path>) -> anyhow::Result<Client> {
    connect_with(addr, load_tls(tls)?.as_ref())
}

/// A client of the master at `addr`, over mutual TLS with `tls`.
pub fn connect_with(addr: &str, tls: Option<&Tls>) -> anyhow::Result<Client> {
    Ok(match tls {
        Some(tls) => Client::connect_tls(addr, tls)?,
        None => Client::connect(addr)?,
    })
}
