//! The side-by-side comparison of large range queries, in one run, on the
//! same vectors and the same queries:
//!
//! 1. Redis (`redis-server`, started here on loopback): each vector a string
//!    of its dense bytes, each term `BITOP OR` over at most 16 keys at a time
//!    (Redis 7's fast path takes no more) and then over the groups, then
//!    `BITOP AND` and `BITCOUNT`, pipelined per query;
//! 2. bitfold end to end through the master (a cluster in this process on
//!    loopback), `count` form;
//! 3. roaring-rs in this process: `union` per term, `intersection`, `len`;
//! 4. the memory-bandwidth roof: each query's vectors read once with all cores.
//!
//! Each round runs every system over the whole query list at the same
//! concurrency; figures are medians over rounds, so that all systems see the
//! machine's other load alike. Every count must agree, or the run fails.
//! Then the same for a range of vids per term, drawn as a chart.
//!
//! `cargo run --release -p bitfold-benches --bin compare -- --help`

mod chart;
mod redis;
mod report;
mod system;
mod systems;

use std::path::PathBuf;

use anyhow::{Context, bail};
use bitfold_server::master::{CoordinatorPolicy, PlanChoice};
use bitfold_workload::dataset::{DataSet, Shape};
use clap::Parser;

use report::{Report, percent, print_outcome};
use systems::Systems;

/// Compare bitfold with Redis, roaring-rs and the memory roof on large range queries.
#[derive(Debug, Parser)]
#[command(name = "compare")]
pub struct Args {
    /// Slaves of the bitfold cluster.
    #[arg(long, default_value_t = 4)]
    pub slaves: usize,
    /// How bitfold's master picks coordinators: round-robin, random or bandwidth.
    #[arg(long, default_value = "round-robin")]
    pub policy: CoordinatorPolicy,
    /// How bitfold's coordinators gather each term's vector: auto, chain or fan-out.
    #[arg(long, default_value = "auto")]
    pub plan: PlanChoice,
    /// Consecutive vids bitfold places together: a power of two, or `all`
    /// (a column piece of every vector together).
    #[arg(long, value_parser = bitfold_server::cluster::parse_group, default_value = "all")]
    pub group: u64,
    /// Vectors in the data set.
    #[arg(long, default_value_t = 2000)]
    pub vectors: u64,
    /// Bits per vector, as a power of two.
    #[arg(long, default_value_t = 20)]
    pub bits_log2: u32,
    /// Densities to run, each a probability that a bit is set.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.01")]
    pub densities: Vec<f64>,
    /// Terms ANDed by each query.
    #[arg(long, default_value_t = 3)]
    pub terms: usize,
    /// Vids ORed by each term in the main table.
    #[arg(long, default_value_t = 64)]
    pub vids_per_term: usize,
    /// Queries in flight at once, for every system.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Queries in the list each system runs per round.
    #[arg(long, default_value_t = 300)]
    pub queries: usize,
    /// Rounds (each system runs the whole list once per round).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Unmeasured queries before each system's run.
    #[arg(long, default_value_t = 10)]
    pub warmup: u64,
    /// Vids per term of the chart's points (`--chart-vids` with no value: no chart).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "16,32,64,128")]
    pub chart_vids: Vec<usize>,
    /// Queries per system per chart point.
    #[arg(long, default_value_t = 150)]
    pub chart_queries: usize,
    /// Rounds per chart point (each system runs the point's list once per
    /// round; a point's figures are medians over its rounds, as the table's
    /// are), so that a burst of other load on the machine moves a point
    /// less.
    #[arg(long, default_value_t = 3)]
    pub chart_rounds: usize,
    /// Seed of the vectors and queries.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The Redis server program.
    #[arg(long, default_value = "redis-server")]
    pub redis_server: String,
    /// Where to write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where to draw the chart (SVG).
    #[arg(long)]
    pub chart: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.densities.is_empty()
        || args.rounds == 0
        || args.queries == 0
        || args.concurrency == 0
        || args.chart_rounds == 0
    {
        bail!(
            "--densities, --rounds, --queries, --concurrency and --chart-rounds must not be \
             empty or zero"
        );
    }
    if args.bits_log2 > 32 {
        bail!("--bits-log2 is at most 32");
    }
    let server = redis::Server::start(&args.redis_server)?;
    let mut report = Report {
        redis_version: server.version.clone(),
        slaves: args.slaves,
        policy: args.policy.to_string(),
        vectors: args.vectors,
        bits: 1 << args.bits_log2,
        terms: args.terms,
        concurrency: args.concurrency,
        rounds: args.rounds,
        chart_rounds: args.chart_rounds,
        seed: args.seed,
        table: Vec::new(),
        chart: Vec::new(),
    };
    for &density in &args.densities {
        let set = DataSet {
            vectors: args.vectors,
            bits: 1 << args.bits_log2,
            density,
            seed: args.seed,
            first_vid: 0,
        };
        set.check().map_err(anyhow::Error::msg)?;
        eprintln!(
            "density {}: generating {} vectors",
            percent(density),
            set.vectors
        );
        let systems = Systems::load(&args, &set, &server)?;
        let shape = Shape {
            terms: args.terms,
            vids_per_term: args.vids_per_term,
        };
        let outcome = systems.compare(&args, shape, args.queries, args.rounds)?;
        print_outcome(&args, &server.version, &outcome);
        report.table.push(outcome);
        for &vids_per_term in &args.chart_vids {
            let shape = Shape {
                terms: args.terms,
                vids_per_term,
            };
            eprintln!("chart point: {} vids per term", vids_per_term);
            report.chart.push(systems.compare(
                &args,
                shape,
                args.chart_queries,
                args.chart_rounds,
            )?);
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.chart
        && !report.chart.is_empty()
    {
        chart::draw(path, &report)?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}
