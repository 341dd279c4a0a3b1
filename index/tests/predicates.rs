//! For random small tables and random predicates, the translated query's
//! answer, computed on the index's vectors, is exactly the rows that meet
//! the predicate (filtered here from the cells), or with `cover` a superset
//! of them that says so.

use std::collections::BTreeSet;

use bitfold_index::{Binning, Index, Options, Translation, index_str};
use proptest::prelude::*;

/// A column of the generated table.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Int,
    Float,
    Text,
}

const TEXTS: [&str; 5] = ["ant", "bee", "cat", "dog", "eel"];

fn cell(kind: Kind) -> BoxedStrategy<String> {
    match kind {
        Kind::Int => (-12i32..12).prop_map(|n| n.to_string()).boxed(),
        Kind::Float => (-20i32..20)
            .prop_map(|n| (f64::from(n) / 4.0).to_string())
            .boxed(),
        Kind::Text => (0..4usize).prop_map(|i| TEXTS[i].to_string()).boxed(),
    }
}

/// A literal fitting the column, sometimes outside its values.
fn literal(kind: Kind) -> BoxedStrategy<String> {
    match kind {
        Kind::Int => (-14i32..14).prop_map(|n| n.to_string()).boxed(),
        Kind::Float => (-44i32..44)
            .prop_map(|n| (f64::from(n) / 8.0).to_string())
            .boxed(),
        Kind::Text => (0..5usize).prop_map(|i| format!("'{}'", TEXTS[i])).boxed(),
    }
}

/// A condition: its text and the test a row's cell must pass.
#[derive(Debug, Clone)]
struct Condition {
    column: usize,
    op: String,
    literals: Vec<String>,
}

impl Condition {
    fn text(&self) -> String {
        let c = self.column;
        match self.op.as_str() {
            "in" => format!("c{c} IN ({})", self.literals.join(", ")),
            "between" => format!("c{c} between {} AND {}", self.literals[0], self.literals[1]),
            op => format!("c{c} {op} {}", self.literals[0]),
        }
    }

    fn holds(&self, kind: Kind, cell: &str) -> bool {
        if cell.is_empty() {
            return false;
        }
        let order = |literal: &str| match kind {
            Kind::Text => cell.cmp(literal.trim_matches('\'')),
            Kind::Int | Kind::Float => {
                let (a, b): (f64, f64) = (cell.parse().unwrap(), literal.parse().unwrap());
                a.partial_cmp(&b).unwrap()
            }
        };
        use std::cmp::Ordering::*;
        match self.op.as_str() {
            "=" => order(&self.literals[0]) == Equal,
            "<" => order(&self.literals[0]) == Less,
            "<=" => order(&self.literals[0]) != Greater,
            ">" => order(&self.literals[0]) == Greater,
            ">=" => order(&self.literals[0]) != Less,
            "in" => self.literals.iter().any(|l| order(l) == Equal),
            "between" => order(&self.literals[0]) != Less && order(&self.literals[1]) != Greater,
            other => unreachable!("{other}"),
        }
    }
}

fn condition(kinds: Vec<Kind>) -> impl Strategy<Value = Condition> {
    (0..kinds.len()).prop_flat_map(move |column| {
        let kind = kinds[column];
        let ops = prop_oneof![
            Just("="),
            Just("<"),
            Just("<="),
            Just(">"),
            Just(">="),
            Just("in"),
            Just("between")
        ];
        (ops, prop::collection::vec(literal(kind), 1..4)).prop_map(move |(op, mut literals)| {
            if op == "between" && literals.len() < 2 {
                literals.push(literals[0].clone());
            }
            Condition {
                column,
                op: op.to_string(),
                literals,
            }
        })
    })
}

#[derive(Debug, Clone)]
struct Case {
    kinds: Vec<Kind>,
    rows: Vec<Vec<String>>,
    conditions: Vec<Condition>,
    bins: usize,
    quantile: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let kind = prop_oneof![Just(Kind::Int), Just(Kind::Float), Just(Kind::Text)];
    prop::collection::vec(kind, 1..4).prop_flat_map(|kinds| {
        let row = kinds
            .iter()
            .map(|&k| prop_oneof![1 => Just(String::new()), 4 => cell(k)])
            .collect::<Vec<_>>();
        let first = kinds.iter().map(|&k| cell(k)).collect::<Vec<_>>();
        (
            Just(kinds.clone()),
            first,
            prop::collection::vec(row, 0..60),
            prop::collection::vec(condition(kinds), 1..4),
            2usize..8,
            any::<bool>(),
        )
            .prop_map(|(kinds, first, mut rows, conditions, bins, quantile)| {
                // The first row has every cell, so no column is all empty.
                rows.insert(0, first);
                Case {
                    kinds,
                    rows,
                    conditions,
                    bins,
                    quantile,
                }
            })
    })
}

fn csv(case: &Case) -> String {
    let header: Vec<String> = (0..case.kinds.len()).map(|c| format!("c{c}")).collect();
    let mut text = header.join(",") + "\n";
    for row in &case.rows {
        // A blank line is no row: one empty cell alone is written `""`.
        if row.len() == 1 && row[0].is_empty() {
            text.push_str("\"\"");
        }
        text.push_str(&row.join(","));
        text.push('\n');
    }
    text
}

/// The rows the index answers: AND over terms of the OR of their spans' vectors.
fn answer(index: &Index, translation: &Translation) -> BTreeSet<u32> {
    let mut rows: Option<BTreeSet<u32>> = None;
    for spans in &translation.terms {
        let term: BTreeSet<u32> = index
            .vectors
            .iter()
            .filter(|(vid, _)| spans.iter().any(|&(a, b)| (a..=b).contains(vid)))
            .flat_map(|(_, v)| v.as_part().bits().collect::<Vec<_>>())
            .collect();
        rows = Some(match rows {
            None => term,
            Some(held) => held.intersection(&term).copied().collect(),
        });
    }
    rows.unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_index_answers_what_a_scan_of_the_rows_answers(case in case()) {
        let options = Options {
            bins: case.bins,
            binning: if case.quantile { Binning::Quantile } else { Binning::EqualWidth },
            ..Options::default()
        };
        let index = index_str(&csv(&case), &options).unwrap();
        let predicate: Vec<String> = case.conditions.iter().map(Condition::text).collect();
        let predicate = predicate.join(" and ");
        let expected: BTreeSet<u32> = (0..case.rows.len() as u32)
            .filter(|&r| {
                case.conditions
                    .iter()
                    .all(|c| c.holds(case.kinds[c.column], &case.rows[r as usize][c.column]))
            })
            .collect();

        let parsed = bitfold_index::Predicate::parse(&predicate).unwrap();
        for (r, row) in case.rows.iter().enumerate() {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            prop_assert_eq!(
                index.map.matches(&parsed, &cells).unwrap(),
                expected.contains(&(r as u32)),
                "row {} of {}", r, predicate
            );
        }

        let covered = index.map.translate(&predicate, true).unwrap();
        let got = answer(&index, &covered);
        prop_assert!(got.is_superset(&expected), "{} with cover: {:?} misses some of {:?}", predicate, got, expected);
        if !covered.superset {
            prop_assert_eq!(&got, &expected, "{} ({:?}) is exact", predicate, covered.message());
        }
        match index.map.translate(&predicate, false) {
            Ok(exact) => {
                prop_assert!(!exact.superset);
                prop_assert_eq!(answer(&index, &exact), expected, "{} -> {:?}", predicate, exact.message());
            }
            Err(err) => {
                // Taken whole, the split bin made a superset (or nothing was left).
                prop_assert!(covered.superset || covered.terms.is_empty(), "{}: {}", predicate, err);
                prop_assert!(err.problem.contains("falls inside bin"), "{}: {}", predicate, err);
            }
        }
    }
}
