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

mod pairs;
mod roaring_files;

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::portable::PortableError;
use crate::vector::VectorBuf;

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

/// Which field of a pairs line, or the vid of a file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The vector id.
    Vid,
    /// The bit position.
    Bit,
}

impl Field {
    fn max(self) -> u64 {
        match self {
            Field::Vid => u64::MAX,
            Field::Bit => u64::from(u32::MAX),
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Vid => "vid",
            Field::Bit => "bit",
        })
    }
}

/// What is wrong with an input entry.
#[derive(Debug)]
pub enum Problem {
    /// A field holds something other than decimal digits.
    NotANumber {
        /// Which field.
        field: Field,
        /// Its text (shortened if long).
        text: String,
    },
    /// A field holds a negative number.
    Negative {
        /// Which field.
        field: Field,
        /// Its text.
        text: String,
    },
    /// A field's number is too large (vid > 2^64 - 1, bit > 2^32 - 1).
    OutOfRange {
        /// Which field.
        field: Field,
        /// Its text.
        text: String,
    },
    /// A field is empty.
    Empty {
        /// Which field.
        field: Field,
    },
    /// A pairs line does not have exactly two fields.
    FieldCount {
        /// Fields found.
        found: usize,
    },
    /// Something other than a comma, blanks or the line end follows a field.
    Unexpected {
        /// The field it follows.
        after: Field,
        /// The text found.
        text: String,
    },
    /// A pairs line longer than [`MAX_LINE`] bytes.
    LineTooLong,
    /// A roaring input whose name is not `<vid>.roaring`.
    BadFileName(String),
    /// A roaring file that is not a valid portable bitmap.
    InvalidRoaring(PortableError),
    /// A roaring file larger than any valid one ([`MAX_ROARING_FILE`]).
    FileTooLarge(u64),
    /// A directory given for pairs input.
    Directory,
    /// The file cannot be read.
    Io(io::Error),
}

fn range_of(field: Field) -> String {
    format!("{field}s are 0..={}", field.max())
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NotANumber { field, text } => {
                write!(f, "{field} \"{text}\" is not a decimal number")
            }
            Problem::Negative { field, text } => {
                write!(f, "{field} {text} is negative ({})", range_of(*field))
            }
            Problem::OutOfRange { field, text } => {
                write!(f, "{field} {text} is out of range ({})", range_of(*field))
            }
            Problem::Empty { field } => {
                write!(f, "the {field} is empty (lines are \"vid,bit\")")
            }
            Problem::FieldCount { found } => {
                write!(f, "expected 2 fields \"vid,bit\", found {found}")
            }
            Problem::Unexpected { after, text } => {
                write!(
                    f,
                    "unexpected \"{text}\" after the {after} (lines are \"vid,bit\")"
                )
            }
            Problem::LineTooLong => write!(
                f,
                "the line is longer than {MAX_LINE} bytes (is this a pairs file?)"
            ),
            Problem::BadFileName(why) => {
                write!(f, "the file name must be <vid>.roaring, but {why}")
            }
            Problem::InvalidRoaring(e) => write!(f, "{e}"),
            Problem::FileTooLarge(len) => write!(
                f,
                "{len} bytes is larger than any portable roaring bitmap of 32-bit positions \
                 ({MAX_ROARING_FILE} bytes)"
            ),
            Problem::Directory => write!(
                f,
                "is a directory; pairs input is files (give the files in it instead)"
            ),
            Problem::Io(e) => write!(f, "cannot read: {e}"),
        }
    }
}

/// A bad input entry, with its file and (for pairs) its line number.
#[derive(Debug)]
pub struct ImportError {
    /// The file or directory.
    pub path: PathBuf,
    /// The line, 1-based, for an error inside a pairs file.
    pub line: Option<u64>,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.path.display(), self.problem),
            None => write!(f, "{}: {}", self.path.display(), self.problem),
        }
    }
}

/// The message carries the cause's text (the I/O error, the roaring
/// decoder's complaint), so there is no `source()`: each cause is printed once.
impl std::error::Error for ImportError {}

impl ImportError {
    fn file(path: &Path, problem: Problem) -> ImportError {
        ImportError {
            path: path.to_path_buf(),
            line: None,
            problem,
        }
    }

    fn io(path: &Path, e: io::Error) -> ImportError {
        ImportError::file(path, Problem::Io(e))
    }
}

/// Why [`read_batches`] stopped: bad input, or the sink's own error.
#[derive(Debug, thiserror::Error)]
pub enum ReadError<E> {
    /// The input is bad or unreadable.
    #[error(transparent)]
    Input(#[from] ImportError),
    /// The sink failed.
    #[error("{0}")]
    Sink(E),
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

/// Hashes vids cheaply: a keyed 64-bit finaliser (murmur3's fmix64) instead
/// of SipHash, which took most of the time of batching pairs. The key is
/// random per process, so an input cannot be crafted to collide.
#[derive(Clone, Copy)]
struct VidHash {
    key: u64,
}

impl Default for VidHash {
    fn default() -> Self {
        use std::hash::BuildHasher;
        VidHash {
            key: std::hash::RandomState::new().hash_one(0u64),
        }
    }
}

impl std::hash::BuildHasher for VidHash {
    type Hasher = VidHasher;

    fn build_hasher(&self) -> VidHasher {
        VidHasher(self.key)
    }
}

/// The hasher of [`VidHash`]; only ever fed one `u64`.
struct VidHasher(u64);

impl std::hash::Hasher for VidHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, vid: u64) {
        self.0 = crate::mix::fmix64(self.0 ^ vid);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Pairs gathered until a batch is full, then grouped per vid.
///
/// Each pair is appended to one flat list as `(slot, bit)`, where the slot
/// numbers the vids of the batch; grouping happens once per batch with a
/// counting sort. Appending to a per-vid `Vec` instead spent most of its
/// time on cache misses, the input being in no particular vid order.
#[derive(Default)]
struct PairBatcher {
    slot_of: HashMap<u64, u32, VidHash>,
    /// The vid of each slot.
    vids: Vec<u64>,
    /// Pairs per slot.
    counts: Vec<usize>,
    /// `slot << 32 | bit`, in input order.
    pairs: Vec<u64>,
    /// The previous pair's vid and slot: input is often grouped by vid.
    last: Option<(u64, u32)>,
}

impl PairBatcher {
    /// Adds a pair; returns the number of pairs now pending.
    fn add(&mut self, vid: u64, bit: u32) -> usize {
        let slot = match self.last {
            Some((last, slot)) if last == vid => slot,
            _ => {
                let next = self.vids.len() as u32;
                let slot = *self.slot_of.entry(vid).or_insert(next);
                if slot == next {
                    self.vids.push(vid);
                    self.counts.push(0);
                }
                self.last = Some((vid, slot));
                slot
            }
        };
        self.counts[slot as usize] += 1;
        self.pairs.push(u64::from(slot) << 32 | u64::from(bit));
        self.pairs.len()
    }

    fn pending(&self) -> usize {
        self.pairs.len()
    }

    /// The pending vectors, ascending by vid; the batcher is left empty.
    fn take(&mut self) -> Vec<(u64, VectorBuf)> {
        let mut next = Vec::with_capacity(self.counts.len());
        let mut start = 0;
        for &count in &self.counts {
            next.push(start);
            start += count;
        }
        let mut bits = vec![0u32; self.pairs.len()];
        for &pair in &self.pairs {
            let slot = (pair >> 32) as usize;
            bits[next[slot]] = pair as u32;
            next[slot] += 1;
        }
        let mut groups: Vec<(u64, &mut [u32])> = Vec::with_capacity(self.vids.len());
        let mut rest = &mut bits[..];
        for (&vid, &count) in self.vids.iter().zip(&self.counts) {
            let (group, tail) = rest.split_at_mut(count);
            groups.push((vid, group));
            rest = tail;
        }
        groups.sort_unstable_by_key(|(vid, _)| *vid);
        let vectors = groups
            .into_par_iter()
            .map(|(vid, group)| {
                group.sort_unstable();
                let len = dedup_sorted(group);
                (vid, VectorBuf::from_sorted_bits(&group[..len]))
            })
            .collect();
        self.slot_of.clear();
        self.vids.clear();
        self.counts.clear();
        self.pairs.clear();
        self.last = None;
        vectors
    }
}

/// Moves the distinct values of sorted `values` to its front; returns how many.
fn dedup_sorted(values: &mut [u32]) -> usize {
    let mut len = 0;
    for i in 0..values.len() {
        if len == 0 || values[i] != values[len - 1] {
            values[len] = values[i];
            len += 1;
        }
    }
    len
}
