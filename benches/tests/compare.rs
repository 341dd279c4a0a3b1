//! The comparison binary on a tiny workload: it starts its own Redis and
//! bitfold cluster, every system answers every query, the counts agree (the
//! binary fails otherwise), and it writes its JSON and chart. Needs
//! `redis-server` (scripts/setup installs it). Never an assertion on speed.

use std::process::Command;

#[test]
fn the_comparison_agrees_on_every_count_and_writes_its_results() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("compare.json");
    let chart = dir.path().join("compare.svg");
    let run = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(["--slaves", "2", "--vectors", "60", "--bits-log2", "17"])
        .args([
            "--densities",
            "0.5,0.01",
            "--terms",
            "2",
            "--vids-per-term",
            "20",
        ])
        .args(["--queries", "12", "--rounds", "2", "--warmup", "2"])
        .args(["--chart-vids", "4,20", "--chart-queries", "5"])
        .arg("--json")
        .arg(&json)
        .arg("--chart")
        .arg(&chart)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "compare failed: {}{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(stdout.matches("every count agreed").count(), 2, "{stdout}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let table = report["table"].as_array().unwrap();
    assert_eq!(table.len(), 2, "one row set per density");
    for outcome in table {
        // 2 terms of 20 vectors of 2^17 bits, each two dense containers.
        assert_eq!(outcome["bytes_per_query"], 2.0 * 20.0 * 16384.0);
        let systems = outcome["systems"].as_array().unwrap();
        let names: Vec<&str> = systems.iter().map(|s| s[0].as_str().unwrap()).collect();
        assert_eq!(names, ["redis", "bitfold", "roaring", "roof"]);
        for system in systems {
            let figures = &system[1];
            assert!(figures["queries_per_second"].as_f64().unwrap() > 0.0);
            assert_eq!(figures["rounds"].as_array().unwrap().len(), 2);
            // Clients ask Redis and bitfold over connections: their CPU is
            // counted apart from the servers'.
            let clients = figures["client_cpu_ms_per_query"].as_f64();
            match system[0].as_str().unwrap() {
                "redis" | "bitfold" => assert!(clients.unwrap() > 0.0, "{system}"),
                _ => assert_eq!(clients, None, "{system}"),
            }
        }
        assert!(outcome["bitfold_over_redis"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(
        report["chart"].as_array().unwrap().len(),
        4,
        "2 points x 2 densities"
    );
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("vids per term"));
}
