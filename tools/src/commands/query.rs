//! `bitfold query`: one query, printed the way `--output` asks; the query
//! is given as a message, or as a predicate translated through an index map.

use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, bail};
use bitfold_client::{self as client, Answer, Bytes, Client, ErrorKind, Format};
use bitfold_engine::{VectorBuf, portable};
use bitfold_index::IndexMap;

use crate::cli::{Output, QueryArgs};

/// How many bit positions the summary shows.
const SUMMARY_BITS: usize = 10;

/// Runs `bitfold query`.
pub fn run(args: QueryArgs) -> anyhow::Result<()> {
    if args.output == Output::Roaring && args.out.is_none() {
        bail!("--output roaring writes a binary file: say where with --out FILE");
    }
    let message = match (&args.query, &args.index, &args.predicate) {
        (Some(query), _, _) => Some(query.clone()),
        (None, Some(index), Some(predicate)) => translate(index, predicate, args.cover)?,
        _ => bail!("give a QUERY, or --index FILE with --where PREDICATE"),
    };
    let stdout = io::stdout().lock();
    let mut out = BufWriter::new(stdout);
    let Some(query) = message else {
        empty_answer(&args, &mut out)?;
        return Ok(out.flush()?);
    };
    let client = super::connect(&args.master, args.tls.as_deref())?;
    match args.output {
        Output::Count => {
            writeln!(out, "{}", count(&client, &query)?)?;
        }
        Output::Bits => {
            for bit in fetch(&client, &query)?.as_part().bits() {
                writeln!(out, "{bit}")?;
            }
        }
        Output::Roaring => {
            let bytes = fetch_roaring(&client, &query)?;
            write_answer(&args, &bytes)?;
        }
        Output::Summary => summary(&client, &query, &mut out)?,
    }
    out.flush()?;
    Ok(())
}

/// The predicate as an `R:` message through the map (shown on stderr with
/// any notes), or `None` when no row can match. A bad predicate is a bad
/// query (exit code 3).
fn translate(index: &Path, predicate: &str, cover: bool) -> anyhow::Result<Option<String>> {
    let map = IndexMap::load(index)?;
    let translation = map
        .translate(predicate, cover)
        .map_err(|err| client::Error::Query {
            kind: ErrorKind::BadQuery,
            message: err.to_string(),
            failed_machines: Vec::new(),
        })?;
    for note in &translation.notes {
        eprintln!("note: {note}");
    }
    let message = translation.message();
    if let Some(message) = &message {
        let superset = if translation.superset {
            "  (a superset of the rows that match)"
        } else {
            ""
        };
        eprintln!("query: {message}{superset}");
    }
    Ok(message)
}

/// The answer of a predicate no row can match, in the form asked for.
fn empty_answer(args: &QueryArgs, out: &mut impl Write) -> anyhow::Result<()> {
    match args.output {
        Output::Count => writeln!(out, "0")?,
        Output::Bits => {}
        Output::Roaring => {
            let empty = VectorBuf::new();
            let part = [empty.as_part()];
            let mut bytes = vec![0u8; portable::serialized_size(&part)];
            portable::write(&part, &mut bytes);
            write_answer(args, &bytes)?;
        }
        Output::Summary => writeln!(out, "no row can match: 0 bits set")?,
    }
    Ok(())
}

fn write_answer(args: &QueryArgs, bytes: &[u8]) -> anyhow::Result<()> {
    let path = args.out.as_ref().expect("checked on entry");
    fs::write(path, bytes).with_context(|| format!("cannot write the answer to {}", path.display()))
}

/// The number of set bits of the answer.
pub fn count(client: &Client, query: &str) -> Result<u64, client::Error> {
    match client.query(query, Format::Count)? {
        Answer::Count(n) => Ok(n),
        _ => Err(client::Error::Protocol(
            "asked for a count, got a vector".into(),
        )),
    }
}

fn fetch_roaring(client: &Client, query: &str) -> Result<Bytes, client::Error> {
    match client.query(query, Format::Roaring)? {
        Answer::Roaring(bytes) => Ok(bytes),
        _ => Err(client::Error::Protocol(
            "asked for roaring, got another form".into(),
        )),
    }
}

/// The answer as a vector.
pub fn fetch(client: &Client, query: &str) -> anyhow::Result<VectorBuf> {
    let bytes = fetch_roaring(client, query)?;
    portable::read(&bytes).context("the master answered a roaring bitmap that does not decode")
}

/// For people: the count, the first bits and the last one.
fn summary(client: &Client, query: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let vector = match fetch(client, query) {
        Ok(vector) => vector,
        Err(err) if is_too_large(&err) => {
            let n = count(client, query)?;
            writeln!(
                out,
                "{query}: {n} bits set (too large to ship whole; counted only)"
            )?;
            return Ok(());
        }
        Err(err) => return Err(err),
    };
    let part = vector.as_part();
    let n = part.cardinality();
    writeln!(out, "{query}: {n} bit{} set", if n == 1 { "" } else { "s" })?;
    if n > 0 {
        let first: Vec<String> = part
            .bits()
            .take(SUMMARY_BITS)
            .map(|b| b.to_string())
            .collect();
        let more = if n as usize > SUMMARY_BITS {
            ", ..."
        } else {
            ""
        };
        writeln!(out, "  first: {}{more}", first.join(", "))?;
        let last = part
            .bits()
            .last()
            .expect("a non-empty vector has a last bit");
        writeln!(out, "  last:  {last}")?;
    }
    Ok(())
}

fn is_too_large(err: &anyhow::Error) -> bool {
    matches!(
        err.downcast_ref::<client::Error>(),
        Some(client::Error::Query {
            kind: ErrorKind::TooLarge,
            ..
        })
    )
}
