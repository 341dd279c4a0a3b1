//! `bitfold bench`: its JSON line holds the figures it promises, against a
//! local cluster of its own or a running one; impossible workloads are
//! refused before anything starts. Never an assertion on speed.

use serde_json::Value;

use crate::util::{Cluster, bitfold, stderr, stdout};

/// The one JSON line of a successful `--json` run.
fn json_line(output: &std::process::Output) -> Value {
    assert!(output.status.success(), "bench failed: {}", stderr(output));
    let text = stdout(output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {text}");
    serde_json::from_str(lines[0]).expect("the line is JSON")
}

fn number(line: &Value, field: &str) -> f64 {
    line[field]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {field} in {line}"))
}

#[test]
fn bench_on_a_local_cluster_reports_its_figures() {
    let run = bitfold(&[
        "bench",
        "--slaves",
        "2",
        "--vectors",
        "40",
        "--bits",
        "2^16",
        "--terms",
        "2",
        "--vids-per-term",
        "8",
        "--queries",
        "20",
        "--warmup",
        "3",
        "--json",
    ]);
    let line = json_line(&run);
    assert_eq!(line["system"], "bitfold");
    assert_eq!(line["form"], "count");
    assert_eq!(line["slaves"], 2);
    assert_eq!(line["queries"], 20);
    assert_eq!(line["concurrency"], 2);
    assert_eq!(line["policy"], "round-robin");
    // 2 terms of 8 vectors, each one dense container of 8 KiB at 50%.
    assert_eq!(number(&line, "bytes_per_query"), 2.0 * 8.0 * 8192.0);
    for field in ["seconds", "queries_per_second", "bitmap_bytes_per_second"] {
        assert!(number(&line, field) > 0.0, "{field} in {line}");
    }
    let (p50, p95, p99) = (
        number(&line, "p50_ms"),
        number(&line, "p95_ms"),
        number(&line, "p99_ms"),
    );
    assert!(0.0 < p50 && p50 <= p95 && p95 <= p99, "{line}");
    assert_eq!(number(&line, "answer_bytes_per_second"), 0.0, "counts only");
}

/// `--tls` runs the same workload plain and over mutual TLS and reports
/// both, with the cost of TLS as the ratio of their times per query.
#[test]
fn bench_with_tls_reports_plain_and_tls_runs_side_by_side() {
    let run = bitfold(&[
        "bench",
        "--tls",
        "--slaves",
        "2",
        "--vectors",
        "40",
        "--bits",
        "2^16",
        "--vids-per-term",
        "8",
        "--queries",
        "20",
        "--json",
    ]);
    let line = json_line(&run);
    for side in ["plain", "tls"] {
        assert_eq!(line[side]["queries"], 20, "{line}");
        assert_eq!(number(&line[side], "bytes_per_query"), 3.0 * 8.0 * 8192.0);
    }
    let ratio =
        number(&line["plain"], "queries_per_second") / number(&line["tls"], "queries_per_second");
    assert!((number(&line, "tls_cost") - ratio).abs() < 1e-9, "{line}");
}

#[test]
fn bench_loads_into_and_queries_a_running_cluster() {
    let cluster = Cluster::start(2, 1);
    // Every bit of 0..1000 is set in every vector: a words answer is 16 words.
    let workload = [
        "bench",
        "--vectors",
        "30",
        "--bits",
        "1000",
        "--density",
        "1",
        "--first-vid",
        "500",
        "--terms",
        "3",
        "--vids-per-term",
        "4",
        "--form",
        "words",
        "--queries",
        "12",
        "--concurrency",
        "3",
        "--json",
    ];
    let line = json_line(&cluster.cli(&workload));
    assert_eq!(line["form"], "words");
    assert_eq!(line["master"], cluster.master_addr().as_str());
    assert_eq!(number(&line, "answer_bytes_per_query"), 128.0);
    assert!(number(&line, "answer_bytes_per_second") > 0.0);

    let count = cluster.cli(&["query", "--output", "count", "R:500-529"]);
    assert_eq!(stdout(&count).trim(), "1000", "{}", stderr(&count));
    let vids = cluster.cli(&[
        "query",
        "--output",
        "count",
        "R:0-499&530-18446744073709551615",
    ]);
    assert_eq!(
        stdout(&vids).trim(),
        "0",
        "vectors outside 500..=529 were made"
    );

    // Already loaded: the same workload without loading answers the same.
    let mut again = workload.to_vec();
    again.push("--skip-load");
    let line = json_line(&cluster.cli(&again));
    assert_eq!(number(&line, "answer_bytes_per_query"), 128.0);
}

#[test]
fn impossible_workloads_are_refused_before_anything_starts() {
    let cases: &[(&[&str], &str)] = &[
        (&["--vectors", "10", "--vids-per-term", "11"], "only 10"),
        (&["--terms", "0"], "at least one term"),
        (&["--concurrency", "0"], "--concurrency"),
        (&["--bits", "2^33"], "2^32"),
        (&["--density", "2"], "density"),
        (&["--slaves", "2", "--replicas", "3"], "--replicas"),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["bench", "--queries", "1"];
        args.extend_from_slice(flags);
        let run = bitfold(&args);
        assert!(!run.status.success(), "{flags:?} was accepted");
        let err = stderr(&run);
        assert!(err.starts_with("error"), "{err}");
        assert!(
            err.contains(expected),
            "{flags:?}: expected {expected:?} in {err}"
        );
    }
}
