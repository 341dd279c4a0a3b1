//! `bitfold demo`: the sample `customers` table indexed with `bitfold
//! index`, a throwaway local cluster on free ports loaded with the index,
//! and example predicates shown next to the `R:` messages they become, each
//! answer checked against a scan of the table itself.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use bitfold_client::Client;
use bitfold_engine::VectorBuf;
use bitfold_engine::import::{self, Format, ReadError};
use bitfold_index::{IndexMap, Options, Predicate, index_file, scan_file, vectors_dir};
use bitfold_server::local::{LocalCluster, loopback};

use super::import::{Action, Destination, import_paths};
use super::index::describe;
use super::query::count;
use crate::cli::DemoArgs;

/// Slaves in the demo cluster.
const SLAVES: usize = 4;
/// Copies of every vector in the demo cluster.
const REPLICAS: usize = 2;

/// The demo's questions: in words, as a predicate, and whether bounds
/// inside bins may take the whole bin (`--cover`).
const EXAMPLES: [(&str, &str, bool); 7] = [
    ("customers in the North", "region = 'North'", false),
    ("customers aged 30 to 39", "age BETWEEN 30 AND 39", false),
    (
        "customers aged 30 to 39 in the North or the East",
        "age BETWEEN 30 AND 39 AND region IN ('North', 'East')",
        false,
    ),
    (
        "customers under 30 who signed up in 2020 or later and last bought Electronics",
        "age < 30 AND signup_year >= 2020 AND last_purchase = 'Electronics'",
        false,
    ),
    (
        "customers who last bought Books or Toys and signed up 2018 to 2020",
        "last_purchase IN ('Books', 'Toys') AND signup_year BETWEEN 2018 AND 2020",
        false,
    ),
    ("customers from Atlantis", "region = 'Atlantis'", false),
    (
        "customers in the South earning 60,000 or more (income is binned, so --cover)",
        "income >= 60000 AND region = 'South'",
        true,
    ),
];

/// Runs `bitfold demo`.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let table = args.data.unwrap_or_else(default_table);
    let dir = tempfile::tempdir().context("cannot create a temporary directory for the demo")?;
    let index = index_file(&table, &Options::default(), &|_, _| {}).with_context(
        || "the demo indexes the sample table: pass --data FILE (see data/README.md)",
    )?;
    let index_dir = dir.path().join("index");
    let vectors = index.write(&index_dir)?;
    let map = index.map;
    println!(
        "Indexed {} with `bitfold index`: {} rows, {vectors} vectors.",
        shown_path(&table).display(),
        map.rows
    );
    for column in &map.columns {
        println!("  {:<14} {}", column.name, describe(column));
    }
    println!();

    let local = LocalCluster::start(
        dir.path(),
        loopback(SLAVES, REPLICAS),
        "127.0.0.1:0",
        |_| {},
    )?;
    let client = Client::connect(&local.master_addr().to_string())?;
    let imported = import_paths(
        &[vectors_dir(&index_dir)],
        Format::Roaring,
        &Destination::Master(client),
        Action::Set,
    )?;
    println!(
        "Started a local cluster (a master on {} and {SLAVES} slaves, {REPLICAS} copies of every vector) \
         and imported the index: {} vectors, {} set bits.\n",
        local.master_addr(),
        imported.vectors,
        imported.bits
    );

    let client = Client::connect(&local.master_addr().to_string())?;
    for (question, predicate, cover) in EXAMPLES {
        let translation = map.translate(predicate, cover)?;
        let expected = scan(&table, &map, predicate)?;
        println!("{}:", capitalise(question));
        println!("  {predicate}");
        let Some(message) = translation.message() else {
            if expected != 0 {
                bail!("the index says no row can match {predicate}, but {expected} rows do");
            }
            println!("  ->  no row can match, nothing to send  (same as computed locally)\n");
            continue;
        };
        let answer = count(&client, &message)?;
        if translation.superset {
            if answer < expected {
                bail!(
                    "the cluster answered {answer} for {message}, fewer than the {expected} rows of {predicate}"
                );
            }
            println!(
                "  ->  {message}  ->  {answer} rows, a superset of the {expected} that match \
                 (the bins on the edge are taken whole)\n"
            );
        } else {
            if answer != expected {
                bail!(
                    "the cluster answered {answer} for {message} but a scan of the table gives {expected}"
                );
            }
            println!(
                "  ->  {message}  ->  {answer} of {} rows  (same as computed locally)\n",
                map.rows
            );
        }
    }

    println!("Mistakes get a clear error and the cluster keeps answering:");
    for predicate in ["age < 35", "regoin = 'North'"] {
        match map.translate(predicate, false) {
            Ok(t) => bail!(
                "{predicate} translated to {:?}; it should have failed",
                t.message()
            ),
            Err(err) => println!("  {predicate}  ->  error: {err}"),
        }
    }
    for bad in ["R:130-", "P:999"] {
        match client.query(bad, bitfold_client::Format::Count) {
            Ok(_) => bail!("the master answered the query {bad}, which should have failed"),
            Err(err) => println!("  {bad}  ->  error: {err}"),
        }
    }
    println!(
        "\nTry it yourself: `bitfold up` in one terminal, then in another\n  \
         bitfold index {} --out customers --master 127.0.0.1:7100\n  \
         bitfold query --index customers/index.toml --where \"age BETWEEN 30 AND 39 AND region = 'North'\"\n  \
         bitfold status",
        shown_path(&table).display()
    );
    Ok(())
}

/// The rows of the table that meet `predicate`, by reading every row.
fn scan(table: &Path, map: &IndexMap, predicate: &str) -> anyhow::Result<u64> {
    let predicate = Predicate::parse(predicate)?;
    let mut matched = 0;
    let mut failed = None;
    scan_file(table, |_, cells| match map.matches(&predicate, cells) {
        Ok(meets) => matched += u64::from(meets),
        Err(err) => failed = Some(err),
    })?;
    match failed {
        Some(err) => Err(err.into()),
        None => Ok(matched),
    }
}

/// `data/customers.csv` of the source tree this binary was built from.
fn default_table() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/customers.csv")
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

fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}
