//! A predicate through the map: each condition picks the vids of its
//! column whose value (or whole bin) meets it, the conditions on one column
//! are intersected, and each column becomes one term of an `R:` message.

use std::cmp::Ordering;

use crate::map::{Bin, Column, Encoding, IndexMap};
use crate::predicate::{Condition, Literal, Op, Predicate, PredicateError, Test, Value};

/// A predicate as a range query.
#[derive(Debug, Clone, PartialEq)]
pub struct Translation {
    /// One term per column named, in the order first named: the spans
    /// `(first, last)` of vids (inclusive) whose vectors the term ORs.
    /// Empty when no row can match.
    pub terms: Vec<Vec<(u64, u64)>>,
    /// Some bins were only partly inside a condition and were taken whole
    /// (`cover`): the answer may hold rows that do not match.
    pub superset: bool,
    /// What a person should know: bins taken whole, or why nothing matches.
    pub notes: Vec<String>,
}

impl Translation {
    /// The `R:` message, or `None` when no row can match (see `notes`).
    pub fn message(&self) -> Option<String> {
        if self.terms.is_empty() {
            return None;
        }
        let terms: Vec<String> = self
            .terms
            .iter()
            .map(|spans| {
                let spans: Vec<String> = spans
                    .iter()
                    .map(|&(a, b)| {
                        if a == b {
                            a.to_string()
                        } else {
                            format!("{a}-{b}")
                        }
                    })
                    .collect();
                spans.join(",")
            })
            .collect();
        Some(format!("R:{}", terms.join("&")))
    }
}

/// How much of a vid's rows meet a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Share {
    None,
    Partial,
    Full,
}

/// Values from `lo` to `hi`, each end included or not (infinite ends for `<`, `>`).
#[derive(Debug, Clone, Copy)]
struct Interval {
    lo: f64,
    lo_in: bool,
    hi: f64,
    hi_in: bool,
}

impl Interval {
    fn of(test: &Test) -> Vec<Interval> {
        let number = |l: &Literal| match l.value {
            Value::Number(n) => n,
            Value::Text(_) => unreachable!("literal types are checked first"),
        };
        let point = |x: f64| Interval {
            lo: x,
            lo_in: true,
            hi: x,
            hi_in: true,
        };
        let below = |x: f64, hi_in: bool| Interval {
            lo: f64::NEG_INFINITY,
            lo_in: true,
            hi: x,
            hi_in,
        };
        let above = |x: f64, lo_in: bool| Interval {
            lo: x,
            lo_in,
            hi: f64::INFINITY,
            hi_in: true,
        };
        match test {
            Test::Compare(op, l) => vec![match op {
                Op::Eq => point(number(l)),
                Op::Lt => below(number(l), false),
                Op::Le => below(number(l), true),
                Op::Gt => above(number(l), false),
                Op::Ge => above(number(l), true),
            }],
            Test::In(ls) => ls.iter().map(|l| point(number(l))).collect(),
            Test::Between(a, b) => vec![Interval {
                lo: number(a),
                lo_in: true,
                hi: number(b),
                hi_in: true,
            }],
        }
    }

    /// The same integers, as `[a, b)` with integer ends.
    fn integers(self) -> Interval {
        Interval {
            lo: if self.lo_in {
                self.lo.ceil()
            } else {
                self.lo.floor() + 1.0
            },
            lo_in: true,
            hi: if self.hi_in {
                self.hi.floor() + 1.0
            } else {
                self.hi.ceil()
            },
            hi_in: false,
        }
    }

    fn contains(&self, x: f64) -> bool {
        let above = if self.lo_in {
            x >= self.lo
        } else {
            x > self.lo
        };
        let below = if self.hi_in {
            x <= self.hi
        } else {
            x < self.hi
        };
        above && below
    }

    /// Holds no value (`BETWEEN 5 AND 1`, or `< 3` on integers from 3 up).
    fn is_empty(&self) -> bool {
        self.lo > self.hi || (self.lo == self.hi && !(self.lo_in && self.hi_in))
    }

    /// How much of the bin `[lo, hi)`, taken as every real in it, lies inside.
    fn share(&self, bin: Bin) -> Share {
        if self.is_empty() {
            return Share::None;
        }
        let starts_in = if self.lo_in {
            self.lo <= bin.lo
        } else {
            self.lo < bin.lo
        };
        if starts_in && bin.hi <= self.hi {
            return Share::Full;
        }
        let after = if self.hi_in {
            bin.lo > self.hi
        } else {
            bin.lo >= self.hi
        };
        if bin.hi <= self.lo || after {
            Share::None
        } else {
            Share::Partial
        }
    }
}

fn text(literal: &Literal) -> &str {
    match &literal.value {
        Value::Text(t) => t,
        Value::Number(_) => unreachable!("literal types are checked first"),
    }
}

fn compare_text(value: &str, test: &Test) -> bool {
    match test {
        Test::Compare(op, l) => {
            let order = value.cmp(text(l));
            match op {
                Op::Eq => order == Ordering::Equal,
                Op::Lt => order == Ordering::Less,
                Op::Le => order != Ordering::Greater,
                Op::Gt => order == Ordering::Greater,
                Op::Ge => order != Ordering::Less,
            }
        }
        Test::In(ls) => ls.iter().any(|l| value == text(l)),
        Test::Between(a, b) => text(a) <= value && value <= text(b),
    }
}

fn literals(test: &Test) -> Vec<&Literal> {
    match test {
        Test::Compare(_, l) => vec![l],
        Test::In(ls) => ls.iter().collect(),
        Test::Between(a, b) => vec![a, b],
    }
}

impl IndexMap {
    /// Translates a predicate (see [`crate::predicate`]) into a range query
    /// on this index. A numeric bound inside a bin is an error naming the
    /// bin's edges, unless `cover` takes the covering bins (the answer is
    /// then a superset, and says so).
    pub fn translate(&self, predicate: &str, cover: bool) -> Result<Translation, PredicateError> {
        self.translate_parsed(&Predicate::parse(predicate)?, cover)
    }

    /// [`IndexMap::translate`] for a parsed predicate.
    pub fn translate_parsed(
        &self,
        predicate: &Predicate,
        cover: bool,
    ) -> Result<Translation, PredicateError> {
        let mut columns: Vec<(&Column, Vec<bool>, Vec<&str>)> = Vec::new();
        let mut superset = false;
        let mut notes = Vec::new();
        for condition in &predicate.conditions {
            let column = self.resolve(condition)?;
            let mut picked = Vec::with_capacity(column.len());
            for vid in 0..column.len() {
                let share = share(column, vid, &condition.test);
                if share == Share::Partial {
                    let Encoding::Bins { bins, .. } = &column.encoding else {
                        unreachable!("only bins are partly inside");
                    };
                    let bin = bins[vid];
                    if !cover {
                        return Err(inside_bin(condition, column, bin));
                    }
                    superset = true;
                    notes.push(format!(
                        "`{}` takes all of bin {bin} of `{}` (--cover): the answer is a superset",
                        condition.text, column.name
                    ));
                }
                picked.push(share != Share::None);
            }
            match columns.iter_mut().find(|(c, _, _)| c.name == column.name) {
                Some((_, held, texts)) => {
                    held.iter_mut().zip(&picked).for_each(|(h, p)| *h &= p);
                    texts.push(&condition.text);
                }
                None => columns.push((column, picked, vec![&condition.text])),
            }
        }
        let mut terms = Vec::with_capacity(columns.len());
        for (column, picked, texts) in columns {
            let spans = spans(column.first_vid, &picked);
            if spans.is_empty() {
                notes.push(format!(
                    "no value of `{}` meets `{}`: no row can match",
                    column.name,
                    texts.join(" AND ")
                ));
                return Ok(Translation {
                    terms: Vec::new(),
                    superset: false,
                    notes,
                });
            }
            terms.push(spans);
        }
        Ok(Translation {
            terms,
            superset,
            notes,
        })
    }

    /// Whether a row (its cells in column order, as in the table) meets the
    /// predicate, judged from the cells themselves: what a scan of the table
    /// answers, and what the index must agree with. A cell is trimmed of
    /// ASCII whitespace only, as the indexer trims it: a vertical tab or a
    /// no-break space is part of its value.
    pub fn matches(&self, predicate: &Predicate, row: &[&str]) -> Result<bool, PredicateError> {
        for condition in &predicate.conditions {
            let column = self.resolve(condition)?;
            let i = self
                .columns
                .iter()
                .position(|c| c.name == column.name)
                .expect("resolved in this map");
            let cell = row.get(i).map_or("", |c| c.trim_ascii());
            if cell.is_empty() {
                return Ok(false);
            }
            let meets = if column.is_numeric() {
                cell.parse::<f64>().is_ok_and(|x| {
                    Interval::of(&condition.test)
                        .iter()
                        .any(|i| i.contains(x + 0.0))
                })
            } else {
                compare_text(cell, &condition.test)
            };
            if !meets {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The column a condition names, its literals checked against its type.
    fn resolve(&self, condition: &Condition) -> Result<&Column, PredicateError> {
        let Some(column) = self.column(&condition.column) else {
            let names: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
            let hint = names
                .iter()
                .find(|n| n.eq_ignore_ascii_case(&condition.column))
                .map(|n| format!(" (names are exact: `{n}`)"))
                .unwrap_or_default();
            return Err(PredicateError::at(
                condition.offset,
                format!(
                    "the index has no column `{}`{hint}; its columns are {}",
                    condition.column,
                    names.join(", ")
                ),
            ));
        };
        for literal in literals(&condition.test) {
            match (&literal.value, column.is_numeric()) {
                (Value::Text(t), true) => {
                    return Err(PredicateError::at(
                        literal.offset,
                        format!(
                            "`{}` holds numbers: write the number bare, not '{t}'",
                            column.name
                        ),
                    ));
                }
                (Value::Number(n), false) => {
                    return Err(PredicateError::at(
                        literal.offset,
                        format!(
                            "`{}` holds text: write the value in single quotes, '{n}'",
                            column.name
                        ),
                    ));
                }
                _ => {}
            }
        }
        Ok(column)
    }
}

/// How much of vid `vid` of `column` meets `test`.
fn share(column: &Column, vid: usize, test: &Test) -> Share {
    match &column.encoding {
        Encoding::Categorical(values) => {
            if compare_text(&values[vid], test) {
                Share::Full
            } else {
                Share::None
            }
        }
        Encoding::Numeric { values, .. } => {
            if Interval::of(test).iter().any(|i| i.contains(values[vid])) {
                Share::Full
            } else {
                Share::None
            }
        }
        Encoding::Bins { integer, bins } => Interval::of(test)
            .into_iter()
            .map(|i| if *integer { i.integers() } else { i })
            .map(|i| i.share(bins[vid]))
            .max()
            .unwrap_or(Share::None),
    }
}

/// The error for a condition that splits `bin`: the nearest edges to use.
fn inside_bin(condition: &Condition, column: &Column, bin: Bin) -> PredicateError {
    let offset = literals(&condition.test)
        .into_iter()
        .find(|l| matches!(l.value, Value::Number(x) if bin.lo < x && x < bin.hi))
        .map_or(condition.offset, |l| l.offset);
    PredicateError::at(
        offset,
        format!(
            "`{}` falls inside bin {bin} of `{}`, whose rows the index cannot split: \
             use {} or {} (the nearest bin edges), or --cover for the covering bins (a superset)",
            condition.text, column.name, bin.lo, bin.hi
        ),
    )
}

/// The runs of picked vids, as inclusive spans starting at `first_vid`.
fn spans(first_vid: u64, picked: &[bool]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (i, _) in picked.iter().enumerate().filter(|(_, p)| **p) {
        let vid = first_vid + i as u64;
        match spans.last_mut() {
            Some((_, last)) if *last + 1 == vid => *last = vid,
            _ => spans.push((vid, vid)),
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use crate::map::tests::example;

    fn message(predicate: &str) -> String {
        example()
            .translate(predicate, false)
            .unwrap_or_else(|e| panic!("{predicate}: {e}"))
            .message()
            .unwrap_or_default()
    }

    #[test]
    fn conditions_become_terms_of_spans() {
        assert_eq!(message("age >= 20 AND age < 40"), "R:100-101");
        assert_eq!(message("age BETWEEN 30 AND 39"), "R:101");
        assert_eq!(message("age <= 29 AND region = 'North'"), "R:100&103");
        assert_eq!(message("region IN ('East', 'North')"), "R:102-103");
        assert_eq!(message("score > -1.5 AND region < 'M'"), "R:105-106&102");
        assert_eq!(message("score IN (3.25, -1.5)"), "R:104,106");
        assert_eq!(message("age > 0 AND age < 30 AND age >= 20"), "R:100");
    }

    #[test]
    fn a_bound_inside_a_bin_names_the_edges_unless_covered() {
        let map = example();
        let err = map.translate("age < 35", false).unwrap_err();
        assert_eq!(err.offset, 6);
        assert!(
            err.problem
                .contains("`age < 35` falls inside bin [30, 40) of `age`")
                && err.problem.contains("use 30 or 40"),
            "{err}"
        );
        let covered = map.translate("age < 35", true).unwrap();
        assert!(covered.superset);
        assert_eq!(covered.message().unwrap(), "R:100-101");
        assert!(covered.notes[0].contains("superset"), "{:?}", covered.notes);
        let exact = map.translate("age < 30", true).unwrap();
        assert!(!exact.superset);
    }

    #[test]
    fn nothing_to_match_is_an_empty_translation_that_says_why() {
        let map = example();
        for predicate in [
            "region = 'West'",
            "age < 10",
            "age < 30 AND age >= 30",
            "blank = 'x'",
            "score BETWEEN 5 AND 1",
            "age BETWEEN 35 AND 31",
            "age BETWEEN 25.2 AND 25.7",
        ] {
            let t = map.translate(predicate, false).unwrap();
            assert_eq!(t.message(), None, "{predicate}");
            assert!(
                t.notes.last().unwrap().contains("no row can match"),
                "{t:?}"
            );
        }
    }

    #[test]
    fn wrong_columns_and_types_are_named() {
        let map = example();
        let cases = [
            (
                "Region = 'x'",
                0,
                "no column `Region` (names are exact: `region`)",
            ),
            (
                "age = 3 AND nope = 1",
                12,
                "its columns are age, region, score, blank",
            ),
            ("age = '3'", 6, "`age` holds numbers: write the number bare"),
            (
                "region IN ('a', 4)",
                16,
                "`region` holds text: write the value in single quotes, '4'",
            ),
        ];
        for (predicate, offset, says) in cases {
            let err = map.translate(predicate, false).unwrap_err();
            assert_eq!(err.offset, offset, "{predicate}: {err}");
            assert!(err.problem.contains(says), "{predicate}: {err}");
        }
    }

    #[test]
    fn rows_are_judged_by_their_cells() {
        let map = example();
        let p = crate::Predicate::parse("age < 35 AND region = 'North'").unwrap();
        assert!(map.matches(&p, &["34", "North", "", ""]).unwrap());
        assert!(!map.matches(&p, &["35", "North", "", ""]).unwrap());
        assert!(!map.matches(&p, &["", "North", "", ""]).unwrap());
        assert!(map.matches(&p, &[" 34\t", "\r North ", "", ""]).unwrap());
        // Not ASCII whitespace: the indexer keeps them in the value.
        assert!(!map.matches(&p, &["34", "\u{b}North", "", ""]).unwrap());
        assert!(!map.matches(&p, &["34", "North\u{a0}", "", ""]).unwrap());
    }
}
