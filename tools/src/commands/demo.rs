//! `bitfold demo`: a throwaway local cluster on free ports, the sample
//! bitmap index loaded through it, the example questions asked and checked
//! against a computation done locally from the same files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use bitfold_engine::VectorBuf;
use bitfold_engine::import::{self, Format, ReadError};
use bitfold_rpc::client::Client;
use bitfold_rpc::local::{LocalCluster, loopback};
use bitfold_rpc::query::{self, Query};

use super::import::{Action, Destination, import_paths};
use super::query::count;
use super::sample::{Index, vectors_dir};
use crate::cli::DemoArgs;

/// Slaves in the demo cluster.
const SLAVES: usize = 4;
/// Copies of every vector in the demo cluster.
const REPLICAS: usize = 2;

/// Runs `bitfold demo`.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let sample = args.data.unwrap_or_else(default_sample_dir);
    let index = Index::load(&sample)
        .with_context(|| "the demo needs the sample data: pass --data DIR (see data/README.md)")?;
    let dir = tempfile::tempdir().context("cannot create a temporary directory for the demo")?;
    let local = LocalCluster::start(
        dir.path(),
        loopback(SLAVES, REPLICAS),
        "127.0.0.1:0",
        |_| {},
    )?;
    println!(
        "Started a local cluster: a master on {} and {SLAVES} slaves, {REPLICAS} copies of every vector.",
        local.master_addr()
    );

    let client = Client::connect(&local.master_addr().to_string())?;
    let vectors = vectors_dir(&sample);
    let imported = import_paths(
        std::slice::from_ref(&vectors),
        Format::Roaring,
        &Destination::Master(client),
        Action::Set,
    )?;
    println!(
        "Loaded the sample bitmap index of a `{}` table ({} rows): {} vectors, {} set bits.\n",
        index.table, index.rows, imported.vectors, imported.bits
    );
    for attribute in &index.attributes {
        let last = attribute.first_vid + attribute.values.len() as u64 - 1;
        println!(
            "  {:<14} vids {}-{}: {} .. {}",
            attribute.name,
            attribute.first_vid,
            last,
            attribute.values.first().map_or("", String::as_str),
            attribute.values.last().map_or("", String::as_str),
        );
    }
    println!();

    let client = Client::connect(&local.master_addr().to_string())?;
    let oracle = bit_sets(&read_vectors(&vectors)?);
    for example in &index.examples {
        let answer = count(&client, &example.query)?;
        let expected = oracle_count(&oracle, &example.query)?;
        if answer != expected {
            bail!(
                "the cluster answered {answer} for {} but the local computation gives {expected}",
                example.query
            );
        }
        println!("{}:", capitalise(&example.question));
        println!(
            "  {}  ->  {answer} of {} rows  (same as computed locally)\n",
            example.query, index.rows
        );
    }

    println!("Mistakes get a clear error and the cluster keeps answering:");
    for bad in ["R:130-", "P:999"] {
        match client.query(bad, bitfold_rpc::client::Format::Count) {
            Ok(_) => bail!("the master answered the query {bad}, which should have failed"),
            Err(err) => println!("  {bad:<8} ->  error: {err}"),
        }
    }
    println!(
        "\nTry it yourself: `bitfold up` in one terminal, then in another\n  \
         bitfold import {}\n  bitfold query 'R:130-139&200'\n  bitfold status",
        shown_path(&vectors).display()
    );
    Ok(())
}

/// `data/sample` of the source tree this binary was built from.
fn default_sample_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/sample")
}

/// `path` made absolute and then relative to the working directory where possible.
fn shown_path(path: &Path) -> PathBuf {
    let absolute = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    std::env::current_dir()
        .ok()
        .and_then(|cwd| absolute.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or(absolute)
}

/// Every `<vid>.roaring` file in `dir`, read as `bitfold import` reads them.
pub fn read_vectors(dir: &Path) -> anyhow::Result<BTreeMap<u64, VectorBuf>> {
    let mut vectors: BTreeMap<u64, VectorBuf> = BTreeMap::new();
    let paths = [dir.to_path_buf()];
    import::read_batches(&paths, Format::Roaring, usize::MAX, &|_| {}, |batch| {
        for (vid, vector) in batch {
            let merged = match vectors.remove(vid) {
                // Two names for one vid (`7.roaring`, `007.roaring`): their union.
                Some(held) => VectorBuf::from_bits(
                    held.as_part()
                        .bits()
                        .chain(vector.as_part().bits())
                        .collect(),
                ),
                None => vector.clone(),
            };
            vectors.insert(*vid, merged);
        }
        Ok::<(), std::convert::Infallible>(())
    })
    .map_err(|err| match err {
        ReadError::Input(err) => anyhow::Error::from(err),
        ReadError::Sink(never) => match never {},
    })?;
    Ok(vectors)
}

/// Each vector's set bits, as plain sets: the demo's oracle.
fn bit_sets(vectors: &BTreeMap<u64, VectorBuf>) -> BTreeMap<u64, BTreeSet<u32>> {
    vectors
        .iter()
        .map(|(vid, vector)| (*vid, vector.as_part().bits().collect()))
        .collect()
}

/// The answer's count, computed here from plain sets of bits rather than
/// with the engine's folds that the cluster demonstrates.
fn oracle_count(vectors: &BTreeMap<u64, BTreeSet<u32>>, message: &str) -> anyhow::Result<u64> {
    let terms: Vec<Vec<(u64, u64)>> =
        match query::parse(message.as_bytes(), &query::Limits::default())? {
            Query::Point(vid) => vec![vec![(vid, vid)]],
            Query::Range(terms) => terms
                .iter()
                .map(|t| t.spans.iter().map(|s| (s.first, s.last)).collect())
                .collect(),
        };
    // Each term's rows (those of every vector in one of its spans), then
    // the rows in every term.
    let unions: Vec<BTreeSet<u32>> = terms
        .iter()
        .map(|spans| {
            spans
                .iter()
                .flat_map(|&(first, last)| vectors.range(first..=last))
                .flat_map(|(_, bits)| bits)
                .copied()
                .collect()
        })
        .collect();
    let Some((first, rest)) = unions.split_first() else {
        return Ok(0);
    };
    let rows = first
        .iter()
        .filter(|row| rest.iter().all(|u| u.contains(row)));
    Ok(rows.count() as u64)
}

fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}
