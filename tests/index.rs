//! `bitfold index` into a real cluster and `bitfold query --where`: every
//! answer is the rows a filter over the table itself picks.

use std::collections::BTreeSet;

use crate::util::{Cluster, Rng, bitfold, stderr, stdout};

const CITIES: [&str; 4] = ["Lima", "Oslo", "Rome", "Kyiv"];

struct Row {
    city: Option<&'static str>,
    score: Option<u64>,
    grade: u64,
}

/// A seeded table: a categorical city (sometimes empty), a score binned by
/// `--bins 10` into [0, 100), [100, 200), ..., and a grade of 1 to 5.
fn table() -> (String, Vec<Row>) {
    let mut rng = Rng(12);
    let mut csv = String::from("city,score,grade\n");
    let mut rows = Vec::new();
    for _ in 0..5000 {
        let row = Row {
            city: (rng.below(10) != 0).then(|| CITIES[rng.below(4) as usize]),
            score: (rng.below(20) != 0).then(|| rng.below(1000)),
            grade: 1 + rng.below(5),
        };
        let score = row.score.map(|s| s.to_string()).unwrap_or_default();
        csv.push_str(&format!(
            "{},{score},{}\n",
            row.city.unwrap_or(""),
            row.grade
        ));
        rows.push(row);
    }
    (csv, rows)
}

fn rows_where(rows: &[Row], keep: impl Fn(&Row) -> bool) -> BTreeSet<u32> {
    (0..rows.len() as u32)
        .filter(|&r| keep(&rows[r as usize]))
        .collect()
}

fn bits(text: &str) -> BTreeSet<u32> {
    text.lines().map(|l| l.parse().unwrap()).collect()
}

#[test]
fn a_table_indexed_into_a_cluster_answers_predicates_like_a_filter() {
    let cluster = Cluster::start(3, 1);
    let (csv, rows) = table();
    let table = cluster.dir().join("table.csv");
    std::fs::write(&table, csv).unwrap();
    let out = cluster.dir().join("idx");
    let run = cluster.cli(&[
        "index",
        table.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--bins",
        "10",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stdout(&run).contains("indexed 5000 rows"),
        "{}",
        stdout(&run)
    );
    assert!(stdout(&run).contains("imported"), "{}", stdout(&run));
    let map = out.join("index.toml");
    let map = map.to_str().unwrap();

    let in_city = |row: &Row, cities: &[&str]| row.city.is_some_and(|c| cities.contains(&c));
    let score = |row: &Row, keep: &dyn Fn(u64) -> bool| row.score.is_some_and(keep);
    let cases: Vec<(&str, BTreeSet<u32>)> = vec![
        (
            "city = 'Oslo'",
            rows_where(&rows, |r| in_city(r, &["Oslo"])),
        ),
        (
            "score >= 200 and score < 500 AND city IN ('Oslo', 'Rome')",
            rows_where(&rows, |r| {
                score(r, &|s| (200..500).contains(&s)) && in_city(r, &["Oslo", "Rome"])
            }),
        ),
        (
            "grade BETWEEN 2 AND 4 AND score <= 99",
            rows_where(&rows, |r| {
                (2..=4).contains(&r.grade) && score(r, &|s| s <= 99)
            }),
        ),
        ("grade > 3 AND grade < 3", BTreeSet::new()),
        ("city = 'Paris'", BTreeSet::new()),
    ];
    for (predicate, expected) in cases {
        let run = cluster.cli(&[
            "query", "--index", map, "--where", predicate, "--output", "bits",
        ]);
        assert!(run.status.success(), "{predicate}: {}", stderr(&run));
        assert_eq!(bits(&stdout(&run)), expected, "{predicate}");
        let shown = stderr(&run);
        assert!(
            shown.contains("query: R:") || shown.contains("no row can match"),
            "{predicate}: {shown}"
        );
        let run = cluster.cli(&[
            "query", "--index", map, "--where", predicate, "--output", "count",
        ]);
        assert_eq!(
            stdout(&run).trim(),
            expected.len().to_string(),
            "{predicate}"
        );
    }

    // A bound inside a bin: refused as a bad query naming the bin's edges,
    // or answered as a superset that says so.
    let exact = rows_where(&rows, |r| score(r, &|s| s < 250));
    let run = cluster.cli(&["query", "--index", map, "--where", "score < 250"]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    assert!(
        stderr(&run).starts_with(
            "error: bad predicate at byte 8: `score < 250` falls inside bin [200, 300)"
        ) && stderr(&run).contains("use 200 or 300"),
        "{}",
        stderr(&run)
    );
    let run = cluster.cli(&[
        "query",
        "--index",
        map,
        "--where",
        "score < 250",
        "--cover",
        "--output",
        "bits",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("superset"), "{}", stderr(&run));
    let got = bits(&stdout(&run));
    assert!(got.is_superset(&exact) && got.len() > exact.len());
}

#[test]
fn bad_tables_name_the_line_and_column_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.csv");
    let out = dir.path().join("idx");
    let index = |csv: &str, extra: &[&str]| {
        std::fs::write(&table, csv).unwrap();
        let mut args = vec![
            "index",
            table.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        bitfold(&args)
    };
    let run = index("a,b\n1,2\n3\n", &[]);
    assert_eq!(run.status.code(), Some(1));
    assert_eq!(
        stderr(&run).trim(),
        "error: line 3 has 1 field but the header has 2: column `b` is missing"
    );
    let run = index("a,b\n1,2\nx,4\n", &["--numeric", "a"]);
    assert!(
        stderr(&run).contains("line 3, column `a`: `x` is not a number"),
        "{}",
        stderr(&run)
    );
    let run = index("id\nu1\nu2\nu3\n", &["--max-values", "2"]);
    assert!(
        stderr(&run).contains("column `id` has more than 2 distinct values")
            && stderr(&run).contains("bin it"),
        "{}",
        stderr(&run)
    );
    assert!(
        !out.join("index.toml").exists(),
        "a failed index writes no map"
    );
}
