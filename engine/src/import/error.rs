//! What can be wrong with import input ([`Problem`]), and the error that
//! names where ([`ImportError`]).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use super::{MAX_LINE, MAX_ROARING_FILE};
use crate::portable::PortableError;

/// Which field of a pairs line, or the vid of a file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The vector id.
    Vid,
    /// The bit position.
    Bit,
}

impl Field {
    pub(super) fn max(self) -> u64 {
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
    pub(super) fn file(path: &Path, problem: Problem) -> ImportError {
        ImportError {
            path: path.to_path_buf(),
            line: None,
            problem,
        }
    }

    pub(super) fn io(path: &Path, e: io::Error) -> ImportError {
        ImportError::file(path, Problem::Io(e))
    }
}

/// Why [`read_batches`](super::read_batches) stopped: bad input, or the sink's own error.
#[derive(Debug, thiserror::Error)]
pub enum ReadError<E> {
    /// The input is bad or unreadable.
    #[error(transparent)]
    Input(#[from] ImportError),
    /// The sink failed.
    #[error("{0}")]
    Sink(E),
}
