//! What a comparison measured: per-system figures, the outcome of one
//! workload, the whole report (written as JSON) and its table for people.

use std::fmt::Write as _;
use std::time::Duration;

use bitfold_workload::harness::{self, Measured};
use serde::Serialize;

use crate::Args;
use crate::system::System;

/// What one system did over all rounds of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Median over rounds of the queries answered per second.
    pub queries_per_second: f64,
    /// Latency percentiles (50, 95, 99) over every round's queries, in ms.
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    /// Median over rounds of the vector bytes the queries read per second.
    pub bytes_per_second: f64,
    /// The system's own CPU time per query asked (warm-up included),
    /// where measured: for Redis and bitfold, the servers', not the clients'.
    pub cpu_ms_per_query: Option<f64>,
    /// The clients' CPU time per query asked, for the systems clients ask
    /// over connections (Redis and bitfold).
    pub client_cpu_ms_per_query: Option<f64>,
    /// Queries per second of each round.
    pub rounds: Vec<f64>,
}

impl Figures {
    /// The figures of `runs` (one per round), with the system's and its
    /// clients' CPU time per query where measured.
    pub fn new(
        runs: &[Measured],
        cpu_ms_per_query: Option<f64>,
        client_cpu_ms_per_query: Option<f64>,
    ) -> Figures {
        let mut latencies: Vec<Duration> = runs
            .iter()
            .flat_map(|m| m.latencies.iter().copied())
            .collect();
        latencies.sort_unstable();
        let ms = |p| harness::percentile(&latencies, p).as_secs_f64() * 1e3;
        let rounds: Vec<f64> = runs.iter().map(Measured::rate).collect();
        Figures {
            queries_per_second: median(rounds.clone()),
            p50_ms: ms(50.0),
            p95_ms: ms(95.0),
            p99_ms: ms(99.0),
            bytes_per_second: median(runs.iter().map(Measured::byte_rate).collect()),
            cpu_ms_per_query,
            client_cpu_ms_per_query,
            rounds,
        }
    }
}

/// One workload's results.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// The data set's density.
    pub density: f64,
    /// Vids ORed by each term.
    pub vids_per_term: usize,
    /// Queries in the list each system ran per round.
    pub queries: usize,
    /// Mean vector bytes a query names (what reading every vector costs).
    pub bytes_per_query: f64,
    /// Bytes bitfold's slaves read per query (range aggregates read less
    /// than the query names).
    pub bitfold_read_bytes_per_query: f64,
    /// Bytes bitfold's slaves sent to other processes per query.
    pub bitfold_sent_bytes_per_query: f64,
    /// Each system's figures, in table order.
    pub systems: Vec<(System, Figures)>,
    /// Medians over rounds of the per-round ratios.
    pub bitfold_over_redis: f64,
    pub bitfold_over_roaring: f64,
    pub bitfold_over_roof: f64,
}

impl Outcome {
    /// The figures of `system`.
    pub fn figures(&self, system: System) -> &Figures {
        &self
            .systems
            .iter()
            .find(|(s, _)| *s == system)
            .expect("every system ran")
            .1
    }
}

/// The whole run, as written to `--json`: its settings, then its outcomes.
#[derive(Debug, Serialize)]
pub struct Report {
    pub redis_version: String,
    pub slaves: usize,
    pub policy: String,
    pub vectors: u64,
    pub bits: u64,
    pub terms: usize,
    pub concurrency: usize,
    pub rounds: usize,
    /// Rounds per chart point.
    pub chart_rounds: usize,
    pub seed: u64,
    /// One outcome per density, at the main table's vids per term.
    pub table: Vec<Outcome>,
    /// The chart's points: per density, one outcome per vids per term.
    pub chart: Vec<Outcome>,
}

/// The middle value (the upper one of an even count; 0 for none).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// A probability as a percentage: `0.01` as `1%`.
pub fn percent(density: f64) -> String {
    format!("{}%", density * 100.0)
}

/// Prints one workload's table.
pub fn print_outcome(args: &Args, redis_version: &str, outcome: &Outcome) {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "\n{} vectors of 2^{} bits at {} density; {} terms x {} vids ({:.1} MiB per query); concurrency {}; {} rounds of {} queries",
        args.vectors,
        args.bits_log2,
        percent(outcome.density),
        args.terms,
        outcome.vids_per_term,
        outcome.bytes_per_query / f64::from(1 << 20),
        args.concurrency,
        args.rounds,
        outcome.queries
    );
    let _ = writeln!(
        text,
        "| system | queries/s | p50 ms | p95 ms | p99 ms | GB/s read | CPU ms/query | clients' CPU ms/query |"
    );
    let _ = writeln!(text, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for (system, f) in &outcome.systems {
        let label = match system {
            System::Redis => format!("Redis {redis_version} (BITOP by 16, pipelined)"),
            System::Bitfold => format!(
                "bitfold ({} slaves, {}, {} plan, group {}, count)",
                args.slaves,
                args.policy,
                args.plan,
                bitfold_server::cluster::group_name(args.group)
            ),
            System::Roaring => "roaring-rs 0.12 (in-process)".to_owned(),
            System::Roof => "memory roof (each query's vectors read, all cores)".to_owned(),
        };
        let ms = |c: Option<f64>| c.map_or("-".to_owned(), |c| format!("{c:.2}"));
        let (cpu, client_cpu) = (ms(f.cpu_ms_per_query), ms(f.client_cpu_ms_per_query));
        let _ = writeln!(
            text,
            "| {label} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {cpu} | {client_cpu} |",
            f.queries_per_second,
            f.p50_ms,
            f.p95_ms,
            f.p99_ms,
            f.bytes_per_second / 1e9
        );
    }
    let _ = writeln!(
        text,
        "bitfold's slaves per query: read {:.2} MiB, sent {:.2} MiB",
        outcome.bitfold_read_bytes_per_query / f64::from(1 << 20),
        outcome.bitfold_sent_bytes_per_query / f64::from(1 << 20)
    );
    let (bitfold, redis) = (
        outcome.figures(System::Bitfold),
        outcome.figures(System::Redis),
    );
    let cpu_share = match (bitfold.cpu_ms_per_query, redis.cpu_ms_per_query) {
        (Some(b), Some(r)) if r > 0.0 => {
            let with_clients =
                |own: f64, f: &Figures| own + f.client_cpu_ms_per_query.unwrap_or(0.0);
            format!(
                " at {:.2} of its CPU per query ({:.2} with each one's clients)",
                b / r,
                with_clients(b, bitfold) / with_clients(r, redis)
            )
        }
        _ => String::new(),
    };
    let _ = writeln!(
        text,
        "bitfold / Redis {:.2}{cpu_share}; bitfold / roaring-rs {:.2}; bitfold / roof {:.2}",
        outcome.bitfold_over_redis, outcome.bitfold_over_roaring, outcome.bitfold_over_roof
    );
    let _ = writeln!(
        text,
        "every count agreed: Redis, bitfold and roaring-rs, {} queries x {} rounds",
        outcome.queries, args.rounds
    );
    print!("{text}");
}
