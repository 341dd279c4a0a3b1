//! `bitfold bench`: its JSON line holds the figures it promises, against a
//! local cluster of its own (plain or over mutual TLS) or a running one;
//! impossible workloads are refused before anything starts; benches/tls.sh
//! reports its pairs of plain and TLS runs. Never an assertion on speed.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::util::{Cluster, bitfold, bitfold_bin, stderr, stdout};

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

/// A local cluster and a data set small enough for a test.
const SMALL: [&str; 8] = [
    "--slaves",
    "2",
    "--vectors",
    "40",
    "--bits",
    "2^16",
    "--vids-per-term",
    "8",
];

#[test]
fn bench_on_a_local_cluster_reports_its_figures() {
    let flags = ["--terms", "2", "--queries", "20", "--warmup", "3", "--json"];
    let run = bitfold(&[&["bench"], &SMALL[..], &flags].concat());
    let line = json_line(&run);
    assert_eq!(line["system"], "bitfold");
    assert_eq!(line["form"], "count");
    assert_eq!(line["slaves"], 2);
    assert_eq!(line["queries"], 20);
    assert_eq!(line["concurrency"], 2);
    assert_eq!(line["policy"], "round-robin");
    assert_eq!(line["tls"], false);
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

/// `--tls` runs the local cluster with mutual TLS on every link, with
/// certificates made for the run: the same workload, answers and figures.
#[test]
fn bench_with_tls_runs_its_local_cluster_over_mutual_tls() {
    let workload = [&["bench", "--tls"], &SMALL[..]].concat();
    let line = json_line(&bitfold(
        &[&workload[..], &["--queries", "20", "--json"]].concat(),
    ));
    assert_eq!(line["tls"], true, "{line}");
    assert_eq!(line["queries"], 20, "{line}");
    assert_eq!(number(&line, "bytes_per_query"), 3.0 * 8.0 * 8192.0);
    for field in [
        "queries_per_second",
        "sent_bytes_per_query",
        "cpu_ms_per_query",
    ] {
        assert!(number(&line, field) > 0.0, "{field} in {line}");
    }

    let run = bitfold(&[&workload[..], &["--queries", "5"]].concat());
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    assert!(
        text.contains("on a local cluster of 2 slaves (") && text.contains(", mutual TLS):"),
        "{text}"
    );
}

/// benches/tls.sh runs `bench` plain and with `--tls` in turn and reports
/// each pair's ratios and their medians.
#[test]
fn the_tls_script_reports_each_pair_of_plain_and_tls_runs() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/tls.sh");
    let run = Command::new(script)
        .env("BITFOLD", bitfold_bin())
        .args(["--rounds", "2"])
        .args(SMALL)
        .args(["--queries", "10"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    let lines: Vec<&str> = text.lines().collect();
    let starts = [
        "round 1, plain: ",
        "round 1, tls: ",
        "round 2, plain: ",
        "round 2, tls: ",
        "pair 1: TLS adds ",
        "pair 2: TLS adds ",
        "median of 2 pairs: TLS adds ",
    ];
    assert_eq!(lines.len(), starts.len(), "{text}");
    for (line, start) in lines.iter().zip(starts) {
        assert!(line.starts_with(start), "{start:?} expected: {text}");
    }
    assert!(lines[0].ends_with(" ms CPU a query"), "{text}");
    assert!(lines[6].ends_with("% CPU a query"), "{text}");
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
