//! `bitfold import`: check the whole input, then send it in batches, with a progress bar.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bitfold_engine::VectorBuf;
use bitfold_engine::import::{self, Format, ReadError};
use bitfold_engine::store::Store;
use bitfold_rpc::client::Client;
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

impl Destination {
    fn send(&self, batch: &[(u64, VectorBuf)]) -> anyhow::Result<()> {
        let parts: Vec<_> = batch
            .iter()
            .map(|(vid, vector)| (*vid, vector.as_part()))
            .collect();
        match self {
            Destination::Master(client) => client.import(&parts)?,
            Destination::Store(store) => {
                store.import(&parts)?;
            }
        }
        Ok(())
    }
}

/// What an import did.
pub struct Imported {
    /// Distinct vectors imported.
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
    let imported = import_paths(&args.paths, format, &destination)?;
    println!(
        "imported {} vectors ({} bits) in {:.1}s",
        imported.vectors,
        imported.bits,
        started.elapsed().as_secs_f64()
    );
    Ok(())
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
        ProgressStyle::with_template("importing [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .expect("the progress template is valid")
            .progress_chars("=> "),
    );
    let mut vectors = BTreeSet::new();
    import::read_batches(
        paths,
        format,
        BATCH_BITS,
        &|bytes| bar.inc(bytes),
        |batch| {
            destination.send(batch)?;
            vectors.extend(batch.iter().map(|(vid, _)| *vid));
            anyhow::Ok(())
        },
    )
    .map_err(|err| match err {
        ReadError::Input(err) => anyhow::Error::from(err),
        ReadError::Sink(err) => err.context(
            "the import stopped part way; what was sent is kept, and running it again is safe",
        ),
    })?;
    bar.finish_and_clear();
    Ok(Imported {
        vectors: vectors.len() as u64,
        bits: summary.bits,
    })
}
