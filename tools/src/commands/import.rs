//! `bitfold import`: check the whole input, then send it in batches, with a
//! progress bar; with `--clear`, the listed bits are cleared instead of set.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bitfold_client::Client;
use bitfold_engine::VectorBuf;
use bitfold_engine::import::{self, Format, ReadError};
use bitfold_engine::store::{Store, Update};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::{DEFAULT_MASTER, ImportArgs, InputFormat};

/// Most set bits held in memory before a batch is sent.
const BATCH_BITS: usize = 16 << 20;

/// Where imported vectors go.
pub enum Destination {
    /// Through the master, to every owner of each vector.
    Master(Client),
    /// Straight into one slave's store (bulk load, no cluster).
    Store(Store),
}

/// What an import does with the bits it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Sets them.
    Set,
    /// Clears them (docs/protocol.md §8).
    Clear,
}

impl Destination {
    /// Sends one batch; returns how many vectors it changed (for a clear)
    /// or held (for a set).
    fn send(&self, batch: &[(u64, VectorBuf)], action: Action) -> anyhow::Result<u64> {
        let parts: Vec<_> = batch
            .iter()
            .map(|(vid, vector)| (*vid, vector.as_part()))
            .collect();
        Ok(match (self, action) {
            (Destination::Master(client), Action::Set) => {
                client.import(&parts)?;
                batch.len() as u64
            }
            (Destination::Store(store), Action::Set) => {
                store.import(&parts)?;
                batch.len() as u64
            }
            (Destination::Master(client), Action::Clear) => client.clear(&parts)?,
            (Destination::Store(store), Action::Clear) => {
                let updates: Vec<_> = parts.iter().map(|&(v, p)| Update::Clear(v, p)).collect();
                store.update(&updates)?.changed.len() as u64
            }
        })
    }
}

/// What an import did.
pub struct Imported {
    /// Distinct vectors imported (for a clear: vectors that lost a bit,
    /// counted once per batch they were sent in).
    pub vectors: u64,
    /// Set bits read from the input (a bit given twice counts twice).
    pub bits: u64,
}

/// Runs `bitfold import`.
pub fn run(args: ImportArgs) -> anyhow::Result<()> {
    let format = resolve_format(args.format, &args.paths);
    let destination = match &args.data_dir {
        Some(dir) => Destination::Store(Store::open(dir)?),
        None => Destination::Master(super::connect(
            args.master.as_deref().unwrap_or(DEFAULT_MASTER),
            args.tls.as_deref(),
        )?),
    };
    let started = Instant::now();
    let action = if args.clear {
        Action::Clear
    } else {
        Action::Set
    };
    let imported = import_paths(&args.paths, format, &destination, action)?;
    let seconds = started.elapsed().as_secs_f64();
    match action {
        Action::Set => println!(
            "imported {} vectors ({} bits) in {seconds:.1}s",
            imported.vectors, imported.bits
        ),
        Action::Clear => println!(
            "cleared bits of {} vectors ({} bits listed) in {seconds:.1}s",
            imported.vectors, imported.bits
        ),
    }
    Ok(())
}

/// Whether the master refused the call for the caller's role.
fn is_forbidden(err: &anyhow::Error) -> bool {
    err.downcast_ref::<bitfold_client::Error>()
        .is_some_and(|e| e.kind() == Some(bitfold_client::ErrorKind::Forbidden))
}

/// `--format` as given, or guessed: roaring when every path is a directory or a `.roaring` file.
pub fn resolve_format(format: Option<InputFormat>, paths: &[PathBuf]) -> Format {
    match format {
        Some(InputFormat::Pairs) => Format::Pairs,
        Some(InputFormat::Roaring) => Format::Roaring,
        None if paths.iter().all(|p| p.is_dir() || is_roaring_file(p)) => Format::Roaring,
        None => Format::Pairs,
    }
}

fn is_roaring_file(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext == "roaring")
}

/// Checks every path, then sends their vectors to `destination` in batches.
/// Nothing is sent if any input is bad.
pub fn import_paths(
    paths: &[PathBuf],
    format: Format,
    destination: &Destination,
    action: Action,
) -> anyhow::Result<Imported> {
    let checking = ProgressBar::new_spinner();
    checking.set_style(
        ProgressStyle::with_template("{spinner} checking the input: {bytes} read")
            .expect("the progress template is valid"),
    );
    let summary = import::validate(paths, format, &|bytes| checking.inc(bytes))?;
    checking.finish_and_clear();
    if summary.skipped > 0 {
        eprintln!(
            "note: skipped {} file(s) not named <vid>.roaring in the given directories",
            summary.skipped
        );
    }

    let bar = ProgressBar::new(summary.bytes);
    bar.set_style(
        ProgressStyle::with_template(match action {
            Action::Set => "importing [{bar:40}] {bytes}/{total_bytes} ({eta})",
            Action::Clear => "clearing [{bar:40}] {bytes}/{total_bytes} ({eta})",
        })
        .expect("the progress template is valid")
        .progress_chars("=> "),
    );
    let mut vectors = BTreeSet::new();
    let mut changed = 0;
    import::read_batches(
        paths,
        format,
        BATCH_BITS,
        &|bytes| bar.inc(bytes),
        |batch| {
            changed += destination.send(batch, action)?;
            vectors.extend(batch.iter().map(|(vid, _)| *vid));
            anyhow::Ok(())
        },
    )
    .map_err(|err| match err {
        ReadError::Input(err) => anyhow::Error::from(err),
        // A refused call changed nothing, and every other batch would be refused alike.
        ReadError::Sink(err) if is_forbidden(&err) => err,
        ReadError::Sink(err) => err.context(
            "the import stopped part way; what was sent is kept, and running it again is safe",
        ),
    })?;
    bar.finish_and_clear();
    Ok(Imported {
        vectors: match action {
            Action::Set => vectors.len() as u64,
            Action::Clear => changed,
        },
        bits: summary.bits,
    })
}
