//! The `bitfold` command. Thin: parse the command line into plain values,
//! build the objects the library crates provide, dispatch, and turn any
//! failure into one `error:` line and a documented exit code (see `--help`).

#![deny(unsafe_code)]

mod cli;
mod commands;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

use bitfold_client::{self as client, ErrorKind};

fn main() -> ExitCode {
    tune_allocator();
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BITFOLD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,openraft=off")),
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

/// Tunes glibc's allocator for bitfold's messages, before any thread exists.
///
/// It keeps freed message buffers for reuse instead of returning them to
/// the kernel, which zero-fills fresh pages on every call: many calls in
/// flight with messages of a few hundred KiB spend most of their time on
/// page faults otherwise. glibc's own sliding threshold gets there after
/// the first large free; this holds from the first call and keeps freed
/// memory from being trimmed. Buffers above 32 MiB (glibc's ceiling for the
/// threshold) are still mapped fresh; their page zeroing is small next to
/// the work on that much data. Plain `bitfold bench` runs took 0.89x the
/// time a query with it on 8 MiB answers and 0.97x on the default workload
/// (benches/runs/2026-12-06-allocator-settings.md).
///
/// This is process-wide allocator tuning, so it belongs to the binary: a DBMS
/// that links `bitfold-client` keeps its own settings.
#[allow(unsafe_code)]
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters; it runs first
    // in `main`, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
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
            ErrorKind::Forbidden => 7,
            ErrorKind::NotLeader => 5,
            ErrorKind::Internal => 1,
        },
        Some(client::Error::Connect { .. }) => 5,
        Some(client::Error::Protocol(_) | client::Error::InsideRuntime) | None => 1,
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
