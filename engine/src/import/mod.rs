//! Reading import input (docs/protocol.md §6): `pairs` text files and `<vid>.roaring` files.
//!
//! An import is checked whole before anything is applied: [`validate`] reads
//! every path and reports the first bad entry with its file and line number
//! (pairs) or file name (roaring). [`read_batches`] then streams the input
//! into batches of vectors whose size is bounded by `batch_bits` set bits,
//! whatever the size of the files.
//!
//! ```
//! use bitfold_engine::import::{self, Format};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("x.csv");
//! std::fs::write(&path, "# vid,bit\n7,1\n7, 5\r\n3,2\n").unwrap();
//! let paths = [path];
//! let summary = import::validate(&paths, Format::Pairs, &|_| {}).unwrap();
//! assert_eq!(summary.bits, 3);
//! let mut vids = Vec::new();
//! import::read_batches(&paths, Format::Pairs, 1000, &|_| {}, |batch| {
//!     vids.extend(batch.iter().map(|(vid, v)| (*vid, v.as_part().cardinality())));
//!     Ok::<(), std::convert::Infallible>(())
//! })
//! .unwrap();
//! assert_eq!(vids, [(3, 1), (7, 2)]);
//! ```
//!
//! This file holds the entry points and the listing of input files;
//! `error.rs` says what can be wrong with input, `pairs.rs` and
//! `roaring_files.rs` read the two formats, and `batch.rs` groups pairs
//! into vectors.

mod batch;
mod error;
mod pairs;
mod roaring_files;

use std::fs;
use std::path::PathBuf;

use crate::vector::VectorBuf;
use batch::PairBatcher;

pub use error::{Field, ImportError, Problem, ReadError};
pub use pairs::MAX_LINE;
pub use roaring_files::MAX_ROARING_FILE;

/// The import formats of docs/protocol.md §6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Text, one set bit per line: `vid,bit` in decimal.
    Pairs,
    /// Files named `<vid>.roaring`, each a portable Roaring bitmap; a
    /// directory stands for every such file in it.
    Roaring,
}

/// What [`validate`] found in the input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Input files that will be read.
    pub files: u64,
    /// Files in directory arguments that are not `<vid>.roaring` files and are skipped.
    pub skipped: u64,
    /// Bytes of the input files (the total [`read_batches`] reports as progress).
    pub bytes: u64,
    /// Set bits in the input, repeats counted: pairs lines, or the bits of the roaring files.
    pub bits: u64,
}

/// Field text for a message: shortened, control characters escaped.
fn show(text: &[u8]) -> String {
    const MAX: usize = 40;
    let shown = text[..text.len().min(MAX)].escape_ascii().to_string();
    if text.len() > MAX {
        format!("{shown}...")
    } else {
        shown
    }
}

/// Parses a whole decimal field, or says what is wrong with it.
fn parse_decimal(text: &[u8], field: Field) -> Result<u64, Problem> {
    if text.is_empty() {
        return Err(Problem::Empty { field });
    }
    let digits = |t: &[u8]| !t.is_empty() && t.iter().all(u8::is_ascii_digit);
    if !digits(text) {
        return Err(match text.strip_prefix(b"-") {
            Some(rest) if digits(rest) => Problem::Negative {
                field,
                text: show(text),
            },
            _ => Problem::NotANumber {
                field,
                text: show(text),
            },
        });
    }
    text.iter()
        .try_fold(0u64, |value, &c| {
            value.checked_mul(10)?.checked_add(u64::from(c - b'0'))
        })
        .filter(|&value| value <= field.max())
        .ok_or_else(|| Problem::OutOfRange {
            field,
            text: show(text),
        })
}

/// One input file.
struct Input {
    path: PathBuf,
    /// The vid its name gives (roaring; pairs files name none and hold 0).
    vid: u64,
    len: u64,
}

/// The files to read: directories expanded (roaring), names checked.
struct Inputs {
    files: Vec<Input>,
    skipped: u64,
}

fn expand(paths: &[PathBuf], format: Format) -> Result<Inputs, ImportError> {
    let mut inputs = Inputs {
        files: Vec::new(),
        skipped: 0,
    };
    for path in paths {
        let meta = fs::metadata(path).map_err(|e| ImportError::io(path, e))?;
        match format {
            Format::Pairs if meta.is_dir() => {
                return Err(ImportError::file(path, Problem::Directory));
            }
            Format::Pairs => inputs.files.push(Input {
                path: path.clone(),
                vid: 0,
                len: meta.len(),
            }),
            Format::Roaring if meta.is_dir() => roaring_files::expand_dir(path, &mut inputs)?,
            Format::Roaring => {
                let vid = roaring_files::vid_of(path)?.ok_or_else(|| {
                    ImportError::file(
                        path,
                        Problem::BadFileName("it does not end in .roaring".into()),
                    )
                })?;
                inputs.files.push(Input {
                    path: path.clone(),
                    vid,
                    len: meta.len(),
                });
            }
        }
    }
    Ok(inputs)
}

/// Checks the whole input (every path) and summarises it; the first bad
/// entry is reported with its file and line (pairs) or file name (roaring).
/// `progress` is called with the number of bytes just read, as reading goes.
pub fn validate(
    paths: &[PathBuf],
    format: Format,
    progress: &dyn Fn(u64),
) -> Result<Summary, ImportError> {
    let inputs = expand(paths, format)?;
    let mut summary = Summary {
        files: inputs.files.len() as u64,
        skipped: inputs.skipped,
        bytes: inputs.files.iter().map(|f| f.len).sum(),
        bits: 0,
    };
    for input in &inputs.files {
        summary.bits += match format {
            Format::Pairs => {
                let mut pairs = 0u64;
                pairs::parse(&input.path, progress, |_, _| {
                    pairs += 1;
                    Ok::<(), std::convert::Infallible>(())
                })
                .map_err(|e| match e {
                    ReadError::Input(e) => e,
                    ReadError::Sink(never) => match never {},
                })?;
                pairs
            }
            Format::Roaring => roaring_files::read(input, progress)?
                .as_part()
                .cardinality(),
        };
    }
    Ok(summary)
}

/// Parses pairs text read from any `input` as an import reads a pairs
/// file, at most `chunk` bytes at a time (an import reads 1 MiB), calling
/// `on_pair` for each pair in order; errors name `path` and the line.
pub fn parse_pairs<E>(
    input: impl std::io::Read,
    chunk: usize,
    path: &std::path::Path,
    on_pair: impl FnMut(u64, u32) -> Result<(), E>,
) -> Result<(), ReadError<E>> {
    pairs::parse_from(input, chunk, path, &|_| {}, on_pair)
}

/// Reads the input and hands it to `sink` in batches of vectors, ascending
/// by vid, each batch holding about `batch_bits` set bits: memory is bounded
/// by `batch_bits`, never by the size of the files (a single roaring file
/// larger than `batch_bits` makes a batch of its own). A vid may appear in
/// several batches; for roaring input, files naming the same vid (`7` and
/// `007`) may give it twice in one batch. `progress` is called with the
/// number of bytes just read.
///
/// Bad input stops the reading with the same error [`validate`] gives; run
/// [`validate`] first so that nothing of a bad import is applied.
pub fn read_batches<E>(
    paths: &[PathBuf],
    format: Format,
    batch_bits: usize,
    progress: &dyn Fn(u64),
    mut sink: impl FnMut(&[(u64, VectorBuf)]) -> Result<(), E>,
) -> Result<(), ReadError<E>> {
    let inputs = expand(paths, format)?;
    let limit = batch_bits.max(1);
    match format {
        Format::Pairs => {
            // The slot numbers of a batch must fit in 32 bits.
            let limit = limit.min(u32::MAX as usize);
            let mut batcher = PairBatcher::default();
            for input in &inputs.files {
                pairs::parse(&input.path, progress, |vid, bit| {
                    if batcher.add(vid, bit) >= limit {
                        sink(&batcher.take())?;
                    }
                    Ok(())
                })?;
            }
            if batcher.pending() > 0 {
                sink(&batcher.take()).map_err(ReadError::Sink)?;
            }
        }
        Format::Roaring => {
            let mut batch: Vec<(u64, VectorBuf)> = Vec::new();
            let mut pending = 0u64;
            for input in &inputs.files {
                let vector = roaring_files::read(input, progress)?;
                let bits = vector.as_part().cardinality();
                if pending > 0 && pending + bits > limit as u64 {
                    batch.sort_by_key(|&(vid, _)| vid);
                    sink(&batch).map_err(ReadError::Sink)?;
                    batch.clear();
                    pending = 0;
                }
                if bits > 0 {
                    batch.push((input.vid, vector));
                    pending += bits;
                }
            }
            if !batch.is_empty() {
                batch.sort_by_key(|&(vid, _)| vid);
                sink(&batch).map_err(ReadError::Sink)?;
            }
        }
    }
    Ok(())
}
