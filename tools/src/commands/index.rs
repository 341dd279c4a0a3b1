//! `bitfold index`: a CSV table to a bitmap index on disk, with a progress
//! bar over both passes; with `--master`, imported as `bitfold import` does.

use std::fs;
use std::time::Instant;

use bitfold_client::Client;
use bitfold_engine::import::Format;
use bitfold_index::{Binning, Column, Encoding, Options, Pass, index_file, vectors_dir};
use indicatif::{ProgressBar, ProgressStyle};

use super::import::{Action, Destination, import_paths};
use crate::cli::{BinningArg, IndexArgs};

/// Runs `bitfold index`.
pub fn run(args: IndexArgs) -> anyhow::Result<()> {
    let options = Options {
        bins: args.bins as usize,
        binning: match args.binning {
            BinningArg::EqualWidth => Binning::EqualWidth,
            BinningArg::Quantile => Binning::Quantile,
        },
        max_values: args.max_values,
        first_vid: args.first_vid,
        numeric: args.numeric,
        categorical: args.categorical,
    };
    // Connect first: a wrong address should not cost an indexing run.
    let client = args.master.as_deref().map(Client::connect).transpose()?;
    let started = Instant::now();
    let size = fs::metadata(&args.table).map_or(0, |m| m.len());
    let bar = ProgressBar::new(2 * size);
    bar.set_style(
        ProgressStyle::with_template("indexing, {msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .expect("the progress template is valid")
            .progress_chars("=> "),
    );
    let index = index_file(&args.table, &options, &|pass, bytes| {
        bar.set_message(match pass {
            Pass::Survey => "pass 1 of 2 (types, values, bins)",
            Pass::Encode => "pass 2 of 2 (bits)",
        });
        bar.inc(bytes);
    })?;
    bar.finish_and_clear();
    let written = index.write(&args.out)?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "indexed {} rows of {} in {seconds:.1}s ({:.0} rows/s): {written} vectors in {}, the map in {}",
        index.map.rows,
        args.table.display(),
        index.map.rows as f64 / seconds.max(1e-9),
        vectors_dir(&args.out).display(),
        args.out.join("index.toml").display(),
    );
    for column in &index.map.columns {
        println!("  {:<16} {}", column.name, describe(column));
    }
    if let Some(client) = client {
        let imported = import_paths(
            &[vectors_dir(&args.out)],
            Format::Roaring,
            &Destination::Master(client),
            Action::Set,
        )?;
        println!(
            "imported {} vectors ({} bits) through {}",
            imported.vectors,
            imported.bits,
            args.master.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}

/// A column's type, size and vids, on one line.
pub fn describe(column: &Column) -> String {
    let vids = match column.last_vid() {
        Some(last) => format!("vids {}-{last}", column.first_vid),
        None => "no vids (every cell is empty)".to_string(),
    };
    let integer = |integer: bool| if integer { "integer" } else { "numeric" };
    let kind = match &column.encoding {
        Encoding::Categorical(values) => format!("categorical, {} values", values.len()),
        Encoding::Numeric { integer: i, values } => {
            format!("{}, {} values", integer(*i), values.len())
        }
        Encoding::Bins { integer: i, bins } => format!(
            "{}, {} bins from {} to {}",
            integer(*i),
            bins.len(),
            bins.first().map_or(0.0, |b| b.lo),
            bins.last().map_or(0.0, |b| b.hi)
        ),
    };
    format!("{kind:<36} {vids}")
}
