//! Why a table could not be indexed: each error names the file, line and
//! column where it can, and what to do.

use std::path::PathBuf;

/// Why a table could not be indexed, or its index not written.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The table could not be opened.
    #[error("cannot read the table {}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The CSV reader failed (I/O, or malformed quoting).
    #[error("line {line}: cannot read the table")]
    Csv {
        /// Line where reading stopped.
        line: u64,
        /// What the CSV reader said.
        source: csv::Error,
    },
    /// The table is empty.
    #[error("the table has no header row: its first line must name the columns")]
    NoHeader,
    /// The header row names a column twice, or not at all.
    #[error("bad header row: {0}")]
    BadHeader(String),
    /// A row has more or fewer fields than the header.
    #[error(
        "line {line} has {fields} field{} but the header has {expected}{}",
        if *fields == 1 { "" } else { "s" },
        match missing { Some(name) => format!(": column `{name}` is missing"), None => String::new() }
    )]
    Ragged {
        /// The line.
        line: u64,
        /// Fields on it.
        fields: usize,
        /// Fields in the header.
        expected: usize,
        /// The first column with no field, if the row is short.
        missing: Option<String>,
    },
    /// A cell of a `--numeric` column is not a number.
    #[error(
        "line {line}, column `{column}`: `{cell}` is not a number, and --numeric says the column is numeric"
    )]
    NotANumber {
        /// The line.
        line: u64,
        /// The column.
        column: String,
        /// The cell as written.
        cell: String,
    },
    /// A text cell is not UTF-8.
    #[error("line {line}, column `{column}`: the cell is not UTF-8 text")]
    NotUtf8 {
        /// The line.
        line: u64,
        /// The column.
        column: String,
    },
    /// A categorical column has more distinct values than vectors allowed.
    #[error(
        "column `{column}` has more than {limit} distinct values (line {line}: `{cell}`){}; \
         one vector per value would be too many: bin it before indexing (or make it numeric), \
         or raise --max-values",
        match first_text {
            Some((line, cell)) => format!(" and is categorical (line {line}: `{cell}` is not a number)"),
            None => String::new(),
        }
    )]
    TooManyValues {
        /// The column.
        column: String,
        /// `--max-values`.
        limit: usize,
        /// Line of the first value over the limit.
        line: u64,
        /// That value.
        cell: String,
        /// The cell that made the column categorical, if it was not forced.
        first_text: Option<(u64, String)>,
    },
    /// `--numeric` or `--categorical` names a column the header does not have.
    #[error("{flag} names no column `{name}`: the columns are {known}")]
    UnknownColumn {
        /// The flag.
        flag: &'static str,
        /// The name given.
        name: String,
        /// The header's names.
        known: String,
    },
    /// Rows are bit positions, which are 32-bit.
    #[error("the table has {rows} rows: at most 2^32 fit (row i is bit i); split the table")]
    TooManyRows {
        /// Rows counted.
        rows: u64,
    },
    /// The vids would pass what the map file can hold.
    #[error(
        "the vids from {first_vid} on pass 2^63 - 1, the largest the map file holds: use a smaller --first-vid"
    )]
    VidsOverflow {
        /// `--first-vid`.
        first_vid: u64,
    },
    /// The second pass read something the first did not.
    #[error(
        "line {line}, column `{column}`: the table changed while it was being indexed; run again"
    )]
    Changed {
        /// The line.
        line: u64,
        /// The column.
        column: String,
    },
    /// The output folder holds vectors of something else.
    #[error(
        "{} is not a vector of this index, and importing the folder would mix it in: \
         remove the old vectors or choose another --out",
        path.display()
    )]
    StaleVectors {
        /// The foreign file.
        path: PathBuf,
    },
    /// A file of the index could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}
