//! The map of an index (`index.toml`): for each column, its vid range and
//! what each vid stands for — a value, or the bounds `[lo, hi)` of a bin.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Largest vid the map file can hold: TOML integers are signed 64-bit.
pub const MAX_MAP_VID: u64 = i64::MAX as u64;

/// The map of a bitmap index: row `i` of the table is bit `i` of every
/// vector, and each column owns a run of consecutive vids in value order.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexMap {
    /// Rows in the table (bits `0..rows`).
    pub rows: u64,
    /// The columns, in the table's order, on ascending vids.
    pub columns: Vec<Column>,
}

/// One column: vid `first_vid + i` holds the rows whose cell is value (or bin) `i`.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// The column's name, from the header row.
    pub name: String,
    /// Vid of the first value or bin.
    pub first_vid: u64,
    /// What each vid stands for.
    pub encoding: Encoding,
}

/// What the vids of a column stand for, in value order.
#[derive(Debug, Clone, PartialEq)]
pub enum Encoding {
    /// One vid per distinct text, in byte order.
    Categorical(Vec<String>),
    /// One vid per distinct number, ascending.
    Numeric {
        /// Every value of the column is an integer.
        integer: bool,
        /// The values.
        values: Vec<f64>,
    },
    /// One vid per bin `[lo, hi)`; the bins ascend and touch.
    Bins {
        /// Every value of the column is an integer.
        integer: bool,
        /// The bins.
        bins: Vec<Bin>,
    },
}

/// The values `lo <= x < hi` of a numeric column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bin {
    /// Smallest value in the bin.
    pub lo: f64,
    /// First value above the bin.
    pub hi: f64,
}

impl fmt::Display for Bin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", self.lo, self.hi)
    }
}

impl Column {
    /// Number of vids (values or bins) of the column.
    pub fn len(&self) -> usize {
        match &self.encoding {
            Encoding::Categorical(values) => values.len(),
            Encoding::Numeric { values, .. } => values.len(),
            Encoding::Bins { bins, .. } => bins.len(),
        }
    }

    /// The column has no vid (every cell of it is empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The column's last vid, if it has any.
    pub fn last_vid(&self) -> Option<u64> {
        (self.len() as u64)
            .checked_sub(1)
            .map(|n| self.first_vid + n)
    }

    /// The column holds numbers (one per vid, or bins).
    pub fn is_numeric(&self) -> bool {
        !matches!(self.encoding, Encoding::Categorical(_))
    }
}

/// Why a map file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The file could not be read or written.
    #[error("cannot {action} the index map {}", path.display())]
    Io {
        /// "read" or "write".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not the TOML of a map.
    #[error("{} is not an index map written by `bitfold index`", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// What the TOML reader said.
        source: toml::de::Error,
    },
    /// The file parses but says something impossible.
    #[error("the index map {} is inconsistent: {problem}; write it again with `bitfold index`", path.display())]
    Inconsistent {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the column.
        problem: String,
    },
}

impl IndexMap {
    /// Reads and checks a map file.
    pub fn load(path: &Path) -> Result<IndexMap, MapError> {
        let text = fs::read_to_string(path).map_err(|source| MapError::Io {
            action: "read",
            path: path.to_path_buf(),
            source,
        })?;
        IndexMap::from_toml(&text).map_err(|err| match err {
            FromTomlError::Syntax(source) => MapError::Syntax {
                path: path.to_path_buf(),
                source,
            },
            FromTomlError::Inconsistent(problem) => MapError::Inconsistent {
                path: path.to_path_buf(),
                problem,
            },
        })
    }

    /// Writes the map file.
    pub fn save(&self, path: &Path) -> Result<(), MapError> {
        fs::write(path, self.to_toml()).map_err(|source| MapError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        })
    }

    /// The map as the text of `index.toml`.
    pub fn to_toml(&self) -> String {
        let raw = RawMap {
            rows: self.rows,
            columns: self.columns.iter().map(RawColumn::from).collect(),
        };
        let body = toml::to_string(&raw).expect("a map always serialises");
        format!(
            "# The map of a bitmap index written by `bitfold index`: row i of the table is bit i;\n\
             # vid first_vid + k of a column holds the rows whose cell is values[k] (or in bins[k] = [lo, hi)).\n{body}"
        )
    }

    /// Parses and checks the text of `index.toml`.
    pub fn from_toml(text: &str) -> Result<IndexMap, FromTomlError> {
        let raw: RawMap = toml::from_str(text).map_err(FromTomlError::Syntax)?;
        let columns = raw
            .columns
            .into_iter()
            .map(Column::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map_err(FromTomlError::Inconsistent)?;
        let map = IndexMap {
            rows: raw.rows,
            columns,
        };
        map.check().map_err(FromTomlError::Inconsistent)?;
        Ok(map)
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    fn check(&self) -> Result<(), String> {
        let mut next = 0u64;
        for (i, column) in self.columns.iter().enumerate() {
            if self.columns[..i].iter().any(|c| c.name == column.name) {
                return Err(format!("column `{}` appears twice", column.name));
            }
            if column.first_vid < next {
                return Err(format!(
                    "column `{}` starts at vid {}, inside the vids of the column before it",
                    column.name, column.first_vid
                ));
            }
            next = column.first_vid + column.len() as u64;
            if next > MAX_MAP_VID {
                return Err(format!("the vids of column `{}` pass 2^63", column.name));
            }
            column.check_order()?;
        }
        Ok(())
    }
}

/// Why the text of a map is not a map.
#[derive(Debug, thiserror::Error)]
pub enum FromTomlError {
    /// Not the TOML of a map.
    #[error("not the TOML of an index map")]
    Syntax(#[source] toml::de::Error),
    /// Parses, but says something impossible.
    #[error("{0}")]
    Inconsistent(String),
}

impl Column {
    fn check_order(&self) -> Result<(), String> {
        let name = &self.name;
        let ascending = match &self.encoding {
            Encoding::Categorical(values) => values.windows(2).all(|w| w[0] < w[1]),
            Encoding::Numeric { values, .. } => {
                values.iter().all(|v| v.is_finite()) && values.windows(2).all(|w| w[0] < w[1])
            }
            Encoding::Bins { bins, .. } => {
                bins.iter()
                    .all(|b| b.lo.is_finite() && b.hi.is_finite() && b.lo < b.hi)
                    && bins.windows(2).all(|w| w[0].hi == w[1].lo)
            }
        };
        if ascending {
            Ok(())
        } else {
            Err(format!(
                "the values or bins of column `{name}` are not ascending (bins must touch)"
            ))
        }
    }
}

/// The file's form: flat, so other languages read it with any TOML library.
#[derive(Serialize, Deserialize)]
struct RawMap {
    rows: u64,
    #[serde(default)]
    columns: Vec<RawColumn>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Categorical,
    Numeric,
    Bins,
}

#[derive(Serialize, Deserialize)]
struct RawColumn {
    name: String,
    kind: Kind,
    #[serde(default, skip_serializing_if = "is_false")]
    integer: bool,
    first_vid: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_vid: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    values: Vec<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    bins: Vec<[Number; 2]>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Value {
    Number(Number),
    Text(String),
}

/// A number written as a TOML integer when it is one, else as a float.
#[derive(Clone, Copy)]
struct Number(f64);

impl Serialize for Number {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.fract() == 0.0 && self.0.abs() < 9.0e15 {
            serializer.serialize_i64(self.0 as i64)
        } else {
            serializer.serialize_f64(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Number, E> {
                Ok(Number(v))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl From<&Column> for RawColumn {
    fn from(column: &Column) -> RawColumn {
        let (kind, integer, values, bins) = match &column.encoding {
            Encoding::Categorical(values) => (
                Kind::Categorical,
                false,
                values.iter().cloned().map(Value::Text).collect(),
                Vec::new(),
            ),
            Encoding::Numeric { integer, values } => (
                Kind::Numeric,
                *integer,
                values.iter().map(|&v| Value::Number(Number(v))).collect(),
                Vec::new(),
            ),
            Encoding::Bins { integer, bins } => (
                Kind::Bins,
                *integer,
                Vec::new(),
                bins.iter().map(|b| [Number(b.lo), Number(b.hi)]).collect(),
            ),
        };
        RawColumn {
            name: column.name.clone(),
            kind,
            integer,
            first_vid: column.first_vid,
            last_vid: column.last_vid(),
            values,
            bins,
        }
    }
}

impl TryFrom<RawColumn> for Column {
    type Error = String;

    fn try_from(raw: RawColumn) -> Result<Column, String> {
        let name = raw.name;
        let mixed = || format!("column `{name}` mixes numbers and text in its values");
        let encoding = match raw.kind {
            Kind::Categorical => Encoding::Categorical(
                raw.values
                    .into_iter()
                    .map(|v| match v {
                        Value::Text(t) => Ok(t),
                        Value::Number(_) => Err(mixed()),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Kind::Numeric => Encoding::Numeric {
                integer: raw.integer,
                values: raw
                    .values
                    .into_iter()
                    .map(|v| match v {
                        Value::Number(n) => Ok(n.0),
                        Value::Text(_) => Err(mixed()),
                    })
                    .collect::<Result<_, _>>()?,
            },
            Kind::Bins => Encoding::Bins {
                integer: raw.integer,
                bins: raw
                    .bins
                    .iter()
                    .map(|[lo, hi]| Bin { lo: lo.0, hi: hi.0 })
                    .collect(),
            },
        };
        let column = Column {
            name,
            first_vid: raw.first_vid,
            encoding,
        };
        if raw.last_vid != column.last_vid() {
            return Err(format!(
                "column `{}` says last_vid {:?} but its values give {:?}",
                column.name,
                raw.last_vid,
                column.last_vid()
            ));
        }
        Ok(column)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn example() -> IndexMap {
        IndexMap {
            rows: 10,
            columns: vec![
                Column {
                    name: "age".into(),
                    first_vid: 100,
                    encoding: Encoding::Bins {
                        integer: true,
                        bins: vec![Bin { lo: 20.0, hi: 30.0 }, Bin { lo: 30.0, hi: 40.0 }],
                    },
                },
                Column {
                    name: "region".into(),
                    first_vid: 102,
                    encoding: Encoding::Categorical(vec!["East".into(), "North".into()]),
                },
                Column {
                    name: "score".into(),
                    first_vid: 104,
                    encoding: Encoding::Numeric {
                        integer: false,
                        values: vec![-1.5, 2.0, 3.25],
                    },
                },
                Column {
                    name: "blank".into(),
                    first_vid: 107,
                    encoding: Encoding::Categorical(Vec::new()),
                },
            ],
        }
    }

    #[test]
    fn a_map_survives_its_file() {
        let map = example();
        let text = map.to_toml();
        assert!(text.contains("bins = [[20, 30], [30, 40]]"), "{text}");
        assert_eq!(IndexMap::from_toml(&text).unwrap(), map);
    }

    #[test]
    fn a_map_file_is_read_from_disk_and_errors_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.toml");
        example().save(&path).unwrap();
        assert_eq!(IndexMap::load(&path).unwrap(), example());
        let missing = IndexMap::load(&dir.path().join("nope.toml")).unwrap_err();
        assert!(missing.to_string().contains("nope.toml"), "{missing}");
        fs::write(&path, "rows = 'many'").unwrap();
        let bad = IndexMap::load(&path).unwrap_err();
        assert!(matches!(bad, MapError::Syntax { .. }), "{bad}");
    }

    #[test]
    fn an_inconsistent_map_is_refused_with_the_column() {
        let cases = [
            (
                "first_vid = 102\nlast_vid = 103",
                "first_vid = 101\nlast_vid = 102",
                "inside the vids",
            ),
            ("last_vid = 101", "last_vid = 109", "last_vid"),
            (
                "\"East\", \"North\"",
                "\"North\", \"East\"",
                "not ascending",
            ),
            ("name = \"score\"", "name = \"age\"", "appears twice"),
            ("[30, 40]", "[31, 40]", "bins must touch"),
        ];
        let text = example().to_toml();
        for (from, to, says) in cases {
            assert!(text.contains(from), "{from} not in {text}");
            let edited = text.replacen(from, to, 1);
            let err = IndexMap::from_toml(&edited).unwrap_err();
            assert!(err.to_string().contains(says), "{from} -> {to}: {err}");
        }
    }
}
