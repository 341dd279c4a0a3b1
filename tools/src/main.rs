//! The `bitfold` command. Thin: parse the command line into plain values,
//! build the objects the library crates provide, dispatch, and turn any
//! failure into one `error:` line and a documented exit code (see `--help`).

mod cli;
mod commands;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

use bitfold_rpc::client::{self, ErrorKind};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BITFOLD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match commands::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", one_line(&err));
            ExitCode::from(exit_code(&err))
        }
    }
}

/// The error and its causes on one line, outermost first.
fn one_line(err: &anyhow::Error) -> String {
    err.chain()
        .map(|cause| cause.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}

/// The exit codes documented in `bitfold --help`.
fn exit_code(err: &anyhow::Error) -> u8 {
    match err
        .chain()
        .find_map(|cause| cause.downcast_ref::<client::Error>())
    {
        Some(client::Error::Query { kind, .. }) => match kind {
            ErrorKind::BadQuery => 3,
            ErrorKind::NotFound => 4,
            ErrorKind::Unavailable => 5,
            ErrorKind::TooLarge => 6,
            ErrorKind::Internal => 1,
        },
        Some(client::Error::Connect { .. }) => 5,
        Some(client::Error::Protocol(_)) | None => 1,
    }
}

/// A reader that stopped reading (`bitfold query --output bits ... | head`) is not an error.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
