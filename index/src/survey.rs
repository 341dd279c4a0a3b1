//! The first pass over a table: what each column holds (its type, its
//! distinct values or a sample of them), and the column that makes.

use std::collections::{BTreeSet, HashSet};

use bitfold_engine::mix::SplitMix64;

use crate::bins::{self, Binning};
use crate::build::Options;
use crate::cell::parse_number;
use crate::error::IndexError;
use crate::map::Encoding;

/// Values of a numeric column sampled for quantile bins.
const RESERVOIR: usize = 1 << 16;

/// FNV-1a: the cells hashed on every row are short, where it is several
/// times faster than the standard hasher. Collisions cost time only, and at
/// most `--max-values` texts are ever held.
pub(crate) type Fnv = fnv::FnvBuildHasher;

/// A number ordered totally, for the set of a column's distinct values.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ordered(f64);

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// What the first pass learns of one column.
pub(crate) struct Survey {
    forced_numeric: bool,
    forced_categorical: bool,
    /// The first cell that is not a number: the column is categorical.
    first_text: Option<(u64, String)>,
    integer: bool,
    min: f64,
    max: f64,
    count: u64,
    /// Distinct numbers, until there are more than `--bins`.
    numbers: Option<BTreeSet<Ordered>>,
    /// Distinct texts, until there are more than `--max-values`.
    texts: Option<HashSet<Box<[u8]>, Fnv>>,
    /// Where the texts passed `--max-values`.
    overflow: Option<(u64, String)>,
    /// The column turned out categorical after some numbers, whose texts
    /// (kept only for categorical columns) need another look.
    pub(crate) late: bool,
    /// A uniform sample of the numbers (quantile bins only).
    sample: Vec<f64>,
}

impl Survey {
    /// Starts gathering the column's texts again, from the first row: it
    /// turned categorical after some numbers (`late`).
    pub(crate) fn gather_texts_again(&mut self) {
        self.texts = Some(HashSet::default());
    }

    pub(crate) fn new(name: &String, options: &Options) -> Survey {
        Survey {
            forced_numeric: options.numeric.contains(name),
            forced_categorical: options.categorical.contains(name),
            first_text: None,
            integer: true,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            count: 0,
            numbers: Some(BTreeSet::new()),
            texts: Some(HashSet::default()),
            overflow: None,
            late: false,
            sample: Vec::new(),
        }
    }

    fn is_text(&self) -> bool {
        self.forced_categorical || self.first_text.is_some()
    }

    pub(crate) fn see(
        &mut self,
        cell: &[u8],
        line: u64,
        name: &str,
        options: &Options,
        rng: &mut SplitMix64,
    ) -> Result<(), IndexError> {
        if cell.is_empty() {
            return Ok(());
        }
        self.count += 1;
        if !self.is_text() {
            match parse_number(cell) {
                Some((value, integer)) => {
                    self.see_number(value, integer, options, rng);
                    return Ok(());
                }
                None if self.forced_numeric => {
                    return Err(IndexError::NotANumber {
                        line,
                        column: name.to_string(),
                        cell: String::from_utf8_lossy(cell).into_owned(),
                    });
                }
                None => {
                    self.first_text = Some((line, String::from_utf8_lossy(cell).into_owned()));
                    // Numbers came first: their texts were not kept.
                    self.late = self.count > 1;
                    self.numbers = None;
                    self.sample = Vec::new();
                }
            }
        }
        self.see_text(cell, line, name, options)
    }

    /// Keeps `cell` among the distinct texts, up to `--max-values`.
    pub(crate) fn see_text(
        &mut self,
        cell: &[u8],
        line: u64,
        name: &str,
        options: &Options,
    ) -> Result<(), IndexError> {
        if let Some(texts) = &mut self.texts
            && !texts.contains(cell)
        {
            if std::str::from_utf8(cell).is_err() {
                return Err(IndexError::NotUtf8 {
                    line,
                    column: name.to_string(),
                });
            }
            if texts.len() == options.max_values {
                self.overflow = Some((line, String::from_utf8_lossy(cell).into_owned()));
                self.texts = None;
            } else {
                texts.insert(cell.into());
            }
        }
        Ok(())
    }

    fn see_number(&mut self, value: f64, integer: bool, options: &Options, rng: &mut SplitMix64) {
        self.integer &= integer;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        if let Some(numbers) = &mut self.numbers {
            numbers.insert(Ordered(value));
            if numbers.len() > options.bins {
                self.numbers = None;
            }
        }
        if options.binning == Binning::Quantile {
            if self.sample.len() < RESERVOIR {
                self.sample.push(value);
            } else {
                let pick = rng.below(self.count) as usize;
                if pick < RESERVOIR {
                    self.sample[pick] = value;
                }
            }
        }
    }

    pub(crate) fn encoding(self, name: &str, options: &Options) -> Result<Encoding, IndexError> {
        if self.is_text() {
            let Some(texts) = self.texts else {
                let (line, cell) = self.overflow.expect("texts stop only on overflow");
                return Err(IndexError::TooManyValues {
                    column: name.to_string(),
                    limit: options.max_values,
                    line,
                    cell,
                    first_text: self.first_text,
                });
            };
            let mut values: Vec<String> = texts
                .into_iter()
                .map(|t| String::from_utf8(t.into_vec()).expect("checked when seen"))
                .collect();
            values.sort_unstable();
            return Ok(Encoding::Categorical(values));
        }
        if self.count == 0 && !self.forced_numeric {
            return Ok(Encoding::Categorical(Vec::new()));
        }
        let integer = self.integer;
        Ok(match self.numbers {
            Some(numbers) => Encoding::Numeric {
                integer,
                values: numbers.into_iter().map(|n| n.0).collect(),
            },
            None => {
                let bins = match options.binning {
                    Binning::EqualWidth => {
                        bins::equal_width(self.min, self.max, integer, options.bins)
                    }
                    Binning::Quantile => {
                        let mut sample = self.sample;
                        bins::quantile(&mut sample, self.min, self.max, integer, options.bins)
                    }
                };
                Encoding::Bins { integer, bins }
            }
        })
    }
}
