//! Building the index of a CSV table in two passes over it: the survey
//! (each column's type and values, or its bins) and the encoding (each
//! row's bit set in the vector of its value, container by container).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use bitfold_engine::mix::SplitMix64;
use bitfold_engine::{VectorBuf, portable};

use crate::bins::Binning;
use crate::cell::{cell, parse_number};
use crate::error::IndexError;
use crate::map::{Bin, Column, Encoding, IndexMap, MAX_MAP_VID};
use crate::survey::{Fnv, Survey};

/// Seed of the sample, so an index is the same on every run.
const SEED: u64 = 0x1ade_5eed;
/// Rows between progress reports.
const PROGRESS_ROWS: u64 = 1 << 16;

/// How a table is indexed.
#[derive(Debug, Clone)]
pub struct Options {
    /// A numeric column with at most this many distinct values gets one
    /// vector per value; above, this many bins.
    pub bins: usize,
    /// How bins are cut.
    pub binning: Binning,
    /// Most distinct values of a categorical column (one vector each).
    pub max_values: usize,
    /// Vid of the first column's first vector; the columns follow one another.
    pub first_vid: u64,
    /// Columns that must be numeric: a cell that is not a number is an error.
    pub numeric: Vec<String>,
    /// Columns that are categorical even if every cell is a number (codes, zips).
    pub categorical: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            bins: 64,
            binning: Binning::EqualWidth,
            max_values: 10_000,
            first_vid: 0,
            numeric: Vec::new(),
            categorical: Vec::new(),
        }
    }
}

/// Which pass over the table a progress report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The first: types, values and bins.
    Survey,
    /// The second: the bits.
    Encode,
}

/// A built index: the map and its vectors.
#[derive(Debug)]
pub struct Index {
    /// The map.
    pub map: IndexMap,
    /// Every vector holding at least one bit, by ascending vid.
    pub vectors: Vec<(u64, VectorBuf)>,
}

/// Indexes the CSV file at `path`; `progress` hears the bytes read in each pass.
pub fn index_file(
    path: &Path,
    options: &Options,
    progress: &dyn Fn(Pass, u64),
) -> Result<Index, IndexError> {
    let open = || {
        File::open(path).map_err(|source| IndexError::Open {
            path: path.to_path_buf(),
            source,
        })
    };
    index_table(open, options, progress)
}

/// Indexes the CSV table that `open` gives (called once per pass, each time
/// from the start).
pub fn index_table<R: Read>(
    mut open: impl FnMut() -> Result<R, IndexError>,
    options: &Options,
    progress: &dyn Fn(Pass, u64),
) -> Result<Index, IndexError> {
    let mut table = Table::open(open()?)?;
    let names = table.header.clone();
    for (flag, listed) in [
        ("--numeric", &options.numeric),
        ("--categorical", &options.categorical),
    ] {
        if let Some(name) = listed.iter().find(|n| !names.contains(n)) {
            return Err(IndexError::UnknownColumn {
                flag,
                name: name.clone(),
                known: names.join(", "),
            });
        }
    }
    let mut surveys: Vec<Survey> = names
        .iter()
        .map(|name| Survey::new(name, options))
        .collect();
    let mut rng = SplitMix64(SEED);
    let rows = table.each_row(Pass::Survey, progress, |line, _, record| {
        for (column, survey) in surveys.iter_mut().enumerate() {
            survey.see(
                cell(record, column),
                line,
                &names[column],
                options,
                &mut rng,
            )?;
        }
        Ok(())
    })?;
    if rows > 1 << 32 {
        return Err(IndexError::TooManyRows { rows });
    }
    let late: Vec<usize> = (0..surveys.len()).filter(|&c| surveys[c].late).collect();
    if !late.is_empty() {
        // Rare: a column of numbers with text further down. Gather its
        // texts from the start.
        for &column in &late {
            surveys[column].gather_texts_again();
        }
        Table::open(open()?)?.each_row(Pass::Survey, &|_, _| {}, |line, _, record| {
            for &column in &late {
                let cell = cell(record, column);
                if !cell.is_empty() {
                    surveys[column].see_text(cell, line, &names[column], options)?;
                }
            }
            Ok(())
        })?;
    }

    let mut columns = Vec::with_capacity(names.len());
    let mut next_vid = options.first_vid;
    for (name, survey) in names.iter().zip(surveys) {
        let encoding = survey.encoding(name, options)?;
        let column = Column {
            name: name.clone(),
            first_vid: next_vid,
            encoding,
        };
        next_vid = next_vid
            .checked_add(column.len() as u64)
            .filter(|&v| v <= MAX_MAP_VID)
            .ok_or(IndexError::VidsOverflow {
                first_vid: options.first_vid,
            })?;
        columns.push(column);
    }
    let map = IndexMap { rows, columns };

    let encoders: Vec<Encoder> = map.columns.iter().map(Encoder::new).collect();
    let offsets: Vec<u32> = map
        .columns
        .iter()
        .scan(0u32, |next, c| {
            let first = *next;
            *next += c.len() as u32;
            Some(first)
        })
        .collect();
    let total: usize = map.columns.iter().map(Column::len).sum();
    let mut bits = Bits::new(total);
    let mut table = Table::open(open()?)?;
    let encoded = table.each_row(Pass::Encode, progress, |line, row, record| {
        for (column, encoder) in encoders.iter().enumerate() {
            let cell = cell(record, column);
            if cell.is_empty() {
                continue;
            }
            let value = encoder.encode(cell).ok_or_else(|| IndexError::Changed {
                line,
                column: names[column].clone(),
            })?;
            bits.set(offsets[column] + value, row as u32);
        }
        Ok(())
    })?;
    if encoded != rows || table.header != names {
        return Err(IndexError::Changed {
            line: table.line,
            column: names.first().cloned().unwrap_or_default(),
        });
    }
    let vectors = bits
        .finish()
        .into_iter()
        .enumerate()
        .filter(|(_, v)| v.as_part().cardinality() > 0)
        .map(|(i, v)| (options.first_vid + i as u64, v))
        .collect();
    Ok(Index { map, vectors })
}

impl Index {
    /// Writes `dir/index.toml` and `dir/vectors/<vid>.roaring` (portable
    /// Roaring); returns the number of vector files. Refuses a `vectors`
    /// folder holding other `.roaring` files, which an import of it would
    /// mix in.
    pub fn write(&self, dir: &Path) -> Result<usize, IndexError> {
        let vectors_dir = dir.join("vectors");
        let write_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| IndexError::Write { path, source }
        };
        fs::create_dir_all(&vectors_dir).map_err(write_error(&vectors_dir))?;
        let ours: HashSet<String> = self
            .vectors
            .iter()
            .map(|(vid, _)| format!("{vid}.roaring"))
            .collect();
        for entry in fs::read_dir(&vectors_dir).map_err(write_error(&vectors_dir))? {
            let name = entry
                .map_err(write_error(&vectors_dir))?
                .file_name()
                .to_string_lossy()
                .into_owned();
            if name.ends_with(".roaring") && !ours.contains(&name) {
                return Err(IndexError::StaleVectors {
                    path: vectors_dir.join(name),
                });
            }
        }
        let mut bytes = Vec::new();
        for (vid, vector) in &self.vectors {
            let part = [vector.as_part()];
            bytes.clear();
            bytes.resize(portable::serialized_size(&part), 0);
            portable::write(&part, &mut bytes);
            let path = vectors_dir.join(format!("{vid}.roaring"));
            fs::write(&path, &bytes).map_err(write_error(&path))?;
        }
        let path = dir.join("index.toml");
        fs::write(&path, self.map.to_toml()).map_err(write_error(&path))?;
        Ok(self.vectors.len())
    }
}

/// A CSV reader past the header row.
struct Table<R> {
    reader: csv::Reader<R>,
    header: Vec<String>,
    /// Line of the last record read.
    line: u64,
}

impl<R: Read> Table<R> {
    fn open(input: R) -> Result<Table<R>, IndexError> {
        let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(input);
        let header = reader
            .headers()
            .map_err(|source| IndexError::Csv { line: 1, source })?;
        // Trimmed as cells are ([`cell`]): a no-break space is part of a name.
        let header: Vec<String> = header
            .iter()
            .map(|name| name.trim_ascii().to_string())
            .collect();
        if header.iter().all(String::is_empty) {
            return Err(IndexError::NoHeader);
        }
        if let Some(i) = header.iter().position(String::is_empty) {
            return Err(IndexError::BadHeader(format!(
                "field {} of the header is empty: give every column a name",
                i + 1
            )));
        }
        if let Some((i, name)) = header
            .iter()
            .enumerate()
            .find(|(i, name)| header[..*i].contains(name))
        {
            return Err(IndexError::BadHeader(format!(
                "column `{name}` appears twice in the header (field {}): rename one",
                i + 1
            )));
        }
        Ok(Table {
            reader,
            header,
            line: 1,
        })
    }

    /// Calls `each(line, row, cells)` on every row; returns the row count.
    fn each_row(
        &mut self,
        pass: Pass,
        progress: &dyn Fn(Pass, u64),
        mut each: impl FnMut(u64, u64, &csv::ByteRecord) -> Result<(), IndexError>,
    ) -> Result<u64, IndexError> {
        let mut record = csv::ByteRecord::new();
        let mut row = 0u64;
        let mut reported = 0u64;
        loop {
            let more = self
                .reader
                .read_byte_record(&mut record)
                .map_err(|source| IndexError::Csv {
                    line: self.line + 1,
                    source,
                })?;
            if !more {
                break;
            }
            self.line = record.position().map_or(self.line + 1, |p| p.line());
            if record.len() != self.header.len() {
                // A blank line is no row.
                if record.len() == 1 && cell(&record, 0).is_empty() {
                    continue;
                }
                return Err(IndexError::Ragged {
                    line: self.line,
                    fields: record.len(),
                    expected: self.header.len(),
                    missing: self.header.get(record.len()).cloned(),
                });
            }
            each(self.line, row, &record)?;
            row += 1;
            if row.is_multiple_of(PROGRESS_ROWS) {
                let byte = self.reader.position().byte();
                progress(pass, byte - reported);
                reported = byte;
            }
        }
        progress(pass, self.reader.position().byte() - reported);
        Ok(row)
    }
}

/// How the second pass finds the vector of a cell (its index in the column).
enum Encoder {
    Texts(HashMap<Box<[u8]>, u32, Fnv>),
    Values(Vec<f64>),
    Bins(Vec<Bin>),
}

impl Encoder {
    fn new(column: &Column) -> Encoder {
        match &column.encoding {
            Encoding::Categorical(values) => Encoder::Texts(
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (v.as_bytes().into(), i as u32))
                    .collect(),
            ),
            Encoding::Numeric { values, .. } => Encoder::Values(values.clone()),
            Encoding::Bins { bins, .. } => Encoder::Bins(bins.clone()),
        }
    }

    /// The index of `cell`'s value in the column; `None` if the survey never saw it.
    fn encode(&self, cell: &[u8]) -> Option<u32> {
        match self {
            Encoder::Texts(values) => values.get(cell).copied(),
            Encoder::Values(values) => {
                let (value, _) = parse_number(cell)?;
                values
                    .binary_search_by(|v| v.total_cmp(&value))
                    .ok()
                    .map(|i| i as u32)
            }
            Encoder::Bins(bins) => {
                let (value, _) = parse_number(cell)?;
                let i = bins.partition_point(|b| b.lo <= value).checked_sub(1)?;
                (value < bins[i].hi).then_some(i as u32)
            }
        }
    }
}

/// The vectors being built: the bits of the current container (65,536
/// rows) are gathered per vector, then appended to it.
struct Bits {
    key: u16,
    pending: Vec<Vec<u16>>,
    touched: Vec<u32>,
    vectors: Vec<VectorBuf>,
}

impl Bits {
    fn new(vectors: usize) -> Bits {
        Bits {
            key: 0,
            pending: vec![Vec::new(); vectors],
            touched: Vec::new(),
            vectors: vec![VectorBuf::new(); vectors],
        }
    }

    fn set(&mut self, vector: u32, row: u32) {
        let key = (row >> 16) as u16;
        if key != self.key {
            self.flush();
            self.key = key;
        }
        let pending = &mut self.pending[vector as usize];
        if pending.is_empty() {
            self.touched.push(vector);
        }
        pending.push(row as u16);
    }

    fn flush(&mut self) {
        for &vector in &self.touched {
            let pending = &mut self.pending[vector as usize];
            self.vectors[vector as usize]
                .push_positions(self.key, pending)
                .expect("rows ascend, so containers and positions do");
            pending.clear();
        }
        self.touched.clear();
    }

    fn finish(mut self) -> Vec<VectorBuf> {
        self.flush();
        self.vectors
    }
}

/// Calls `each(row, cells)` on every row of the CSV file at `path`, read
/// as [`index_file`] reads it (header skipped, cells trimmed, blank lines
/// skipped): a scan of the table, to check the index's answers against.
/// Returns the number of rows.
pub fn scan_file(path: &Path, each: impl FnMut(u64, &[&str])) -> Result<u64, IndexError> {
    let file = File::open(path).map_err(|source| IndexError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    scan_table(file, each)
}

/// [`scan_file`] for a table read from `reader`.
pub fn scan_table<R: Read>(
    reader: R,
    mut each: impl FnMut(u64, &[&str]),
) -> Result<u64, IndexError> {
    let mut table = Table::open(reader)?;
    let names = table.header.clone();
    table.each_row(Pass::Survey, &|_, _| {}, |line, row, record| {
        let cells = names
            .iter()
            .enumerate()
            .map(|(column, name)| {
                std::str::from_utf8(cell(record, column)).map_err(|_| IndexError::NotUtf8 {
                    line,
                    column: name.clone(),
                })
            })
            .collect::<Result<Vec<&str>, _>>()?;
        each(row, &cells);
        Ok(())
    })
}

/// Where `bitfold index` puts the vector files of an index in `dir`.
pub fn vectors_dir(dir: &Path) -> PathBuf {
    dir.join("vectors")
}

/// Reads a whole table from a string: for tests and small tables.
pub fn index_str(csv: &str, options: &Options) -> Result<Index, IndexError> {
    index_table(|| Ok(io::Cursor::new(csv.as_bytes())), options, &|_, _| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(index: &Index, vid: u64) -> Vec<u32> {
        index
            .vectors
            .iter()
            .find(|(v, _)| *v == vid)
            .map(|(_, v)| v.as_part().bits().collect())
            .unwrap_or_default()
    }

    #[test]
    fn columns_are_typed_by_their_cells_and_empty_cells_set_no_bit() {
        let csv = "age,region,score\n30,North,1.5\n,East,2\n41,North,\n30,,-1e1\n";
        let index = index_str(csv, &Options::default()).unwrap();
        let map = &index.map;
        assert_eq!(map.rows, 4);
        assert_eq!(
            map.columns[0].encoding,
            Encoding::Numeric {
                integer: true,
                values: vec![30.0, 41.0]
            }
        );
        assert_eq!(
            map.columns[1].encoding,
            Encoding::Categorical(vec!["East".into(), "North".into()])
        );
        assert_eq!(
            map.columns[2].encoding,
            Encoding::Numeric {
                integer: false,
                values: vec![-10.0, 1.5, 2.0]
            }
        );
        let firsts: Vec<u64> = map.columns.iter().map(|c| c.first_vid).collect();
        assert_eq!(firsts, [0, 2, 4]);
        assert_eq!(bits(&index, 0), [0, 3]);
        assert_eq!(bits(&index, 1), [2]);
        assert_eq!(bits(&index, 3), [0, 2]);
        assert_eq!(bits(&index, 6), [1]);
    }

    #[test]
    fn column_names_are_trimmed_of_ascii_whitespace_as_cells_are() {
        let csv = " age\t,\u{a0}region\nX,\u{a0}North\n";
        let index = index_str(csv, &Options::default()).unwrap();
        let names: Vec<&str> = index.map.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["age", "\u{a0}region"]);
        assert_eq!(
            index.map.columns[1].encoding,
            Encoding::Categorical(vec!["\u{a0}North".into()])
        );
    }

    #[test]
    fn one_text_cell_makes_a_column_categorical_and_flags_force_a_type() {
        let csv = "zip,n\n01234,1\n99999,x\n";
        let index = index_str(csv, &Options::default()).unwrap();
        assert!(index.map.columns[0].is_numeric());
        // Numbers, then a text: the numbers' texts are gathered again.
        assert_eq!(
            index.map.columns[1].encoding,
            Encoding::Categorical(vec!["1".into(), "x".into()])
        );
        assert_eq!(bits(&index, 2), [0]);
        assert_eq!(bits(&index, 3), [1]);
        let options = Options {
            categorical: vec!["zip".into()],
            ..Options::default()
        };
        let index = index_str(csv, &options).unwrap();
        assert_eq!(
            index.map.columns[0].encoding,
            Encoding::Categorical(vec!["01234".into(), "99999".into()])
        );
        let options = Options {
            numeric: vec!["n".into()],
            ..Options::default()
        };
        let err = index_str(csv, &options).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 3, column `n`: `x` is not a number, and --numeric says the column is numeric"
        );
        let options = Options {
            numeric: vec!["nope".into()],
            ..Options::default()
        };
        let err = index_str(csv, &options).unwrap_err().to_string();
        assert!(
            err.contains("--numeric names no column `nope`") && err.contains("zip, n"),
            "{err}"
        );
    }

    #[test]
    fn many_distinct_numbers_are_binned_and_each_row_lands_in_its_bin() {
        let mut csv = String::from("x\n");
        for i in 0..1000 {
            csv.push_str(&format!("{}\n", i % 100));
        }
        let options = Options {
            bins: 10,
            ..Options::default()
        };
        let index = index_str(&csv, &options).unwrap();
        let Encoding::Bins { integer, bins } = &index.map.columns[0].encoding else {
            panic!("{:?}", index.map.columns[0]);
        };
        assert!(integer);
        assert_eq!(bins.len(), 10);
        assert_eq!(bins[3], Bin { lo: 30.0, hi: 40.0 });
        let expected: Vec<u32> = (0..1000)
            .filter(|i| (30..40).contains(&(i % 100)))
            .collect();
        assert_eq!(bits(&index, 3), expected);
        let quantile = Options {
            binning: Binning::Quantile,
            ..options
        };
        let index = index_str(&csv, &quantile).unwrap();
        let Encoding::Bins { bins, .. } = &index.map.columns[0].encoding else {
            panic!()
        };
        assert_eq!(bins.len(), 10);
        assert_eq!(bins.last().unwrap().hi, 100.0);
    }

    #[test]
    fn rows_past_one_container_keep_their_positions() {
        let mut csv = String::from("k\n");
        for i in 0..200_000u32 {
            csv.push_str(if i % 3 == 0 { "a\n" } else { "b\n" });
        }
        let index = index_str(&csv, &Options::default()).unwrap();
        let a = bits(&index, 0);
        assert_eq!(a.len(), 66_667);
        assert!(a.iter().all(|r| r % 3 == 0));
        assert_eq!(*a.last().unwrap(), 199_998);
    }

    #[test]
    fn bad_tables_are_refused_naming_the_line_and_column() {
        let cases = [
            ("", "no header row"),
            ("a,,b\n1,2,3\n", "field 2 of the header is empty"),
            ("a,b,a\n", "column `a` appears twice"),
            (
                "a,b\n1,2\n3\n",
                "line 3 has 1 field but the header has 2: column `b` is missing",
            ),
            (
                "a,b\n1,2\n3,4,5\n",
                "line 3 has 3 fields but the header has 2",
            ),
            ("a\nx\ny\nz\n", "column `a` has more than 2 distinct values"),
        ];
        let options = Options {
            max_values: 2,
            ..Options::default()
        };
        for (csv, says) in cases {
            let err = index_str(csv, &options).unwrap_err().to_string();
            assert!(err.contains(says), "{csv:?}: {err}");
        }
        let err = index_table(
            || Ok(io::Cursor::new(b"a\n\xff\n".to_vec())),
            &options,
            &|_, _| {},
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 2, column `a`: the cell is not UTF-8 text"
        );
    }

    #[test]
    fn a_blank_line_is_no_row_but_a_quoted_empty_cell_is() {
        let index = index_str("a,b\n1,2\n\n 3 , 4 \n", &Options::default()).unwrap();
        assert_eq!(index.map.rows, 2);
        assert_eq!(bits(&index, 1), [1]);
        let index = index_str("a\nx\n\"\"\nx\n", &Options::default()).unwrap();
        assert_eq!(index.map.rows, 3);
        assert_eq!(bits(&index, 0), [0, 2]);
    }

    #[test]
    fn unreadable_or_shifting_tables_and_impossible_vids_are_refused() {
        let missing = index_file(
            Path::new("/nonexistent/t.csv"),
            &Options::default(),
            &|_, _| {},
        );
        let err = missing.unwrap_err().to_string();
        assert_eq!(err, "cannot read the table /nonexistent/t.csv");

        let header = index_table(
            || Ok(io::Cursor::new(b"a,\xff\n1,2\n".to_vec())),
            &Options::default(),
            &|_, _| {},
        );
        assert_eq!(
            header.unwrap_err().to_string(),
            "line 1: cannot read the table"
        );

        // The second pass reads a value the first never saw.
        let mut reads = 0;
        let shifting = index_table(
            || {
                reads += 1;
                let text = if reads == 1 { "a\nx\n" } else { "a\ny\n" };
                Ok(io::Cursor::new(text.as_bytes()))
            },
            &Options::default(),
            &|_, _| {},
        );
        assert_eq!(
            shifting.unwrap_err().to_string(),
            "line 2, column `a`: the table changed while it was being indexed; run again"
        );

        let options = Options {
            first_vid: MAX_MAP_VID,
            ..Options::default()
        };
        let err = index_str("a\nx\ny\n", &options).unwrap_err().to_string();
        assert!(err.contains("use a smaller --first-vid"), "{err}");
    }

    #[test]
    fn an_index_is_written_as_a_map_and_roaring_files() {
        let dir = tempfile::tempdir().unwrap();
        let index = index_str("a,b\nx,1\ny,1\n", &Options::default()).unwrap();
        assert_eq!(index.write(dir.path()).unwrap(), 3);
        let x = fs::read(dir.path().join("vectors/0.roaring")).unwrap();
        let x = portable::read(&x).unwrap();
        assert_eq!(x.as_part().bits().collect::<Vec<_>>(), [0]);
        let map = IndexMap::load(&dir.path().join("index.toml")).unwrap();
        assert_eq!(map, index.map);
        fs::write(dir.path().join("vectors/77.roaring"), b"").unwrap();
        let err = index.write(dir.path()).unwrap_err().to_string();
        assert!(err.contains("77.roaring"), "{err}");
    }
}
