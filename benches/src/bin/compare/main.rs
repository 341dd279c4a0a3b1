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

mod cluster;
mod redis;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use bitfold_benches::dataset::{self, DataSet, Query, Shape, part_bytes};
use bitfold_benches::harness::{self, Limit, Measured, Plan, Reply, process_cpu};
use bitfold_benches::read_roof_parallel;
use bitfold_engine::{VectorBuf, VectorPart, words};
use bitfold_rpc::client::{Answer, Client, Format};
use bitfold_rpc::master::CoordinatorPolicy;
use clap::Parser;
use rayon::prelude::*;
use roaring::{MultiOps, RoaringBitmap};
use serde::Serialize;

use redis::{Redis, Value};

/// Compare bitfold with Redis, roaring-rs and the memory roof on large range queries.
#[derive(Debug, Parser)]
#[command(name = "compare")]
struct Args {
    /// Slaves of the bitfold cluster.
    #[arg(long, default_value_t = 4)]
    slaves: usize,
    /// How bitfold's master picks coordinators: round-robin, random or bandwidth.
    #[arg(long, default_value = "round-robin")]
    policy: CoordinatorPolicy,
    /// Vectors in the data set.
    #[arg(long, default_value_t = 2000)]
    vectors: u64,
    /// Bits per vector, as a power of two.
    #[arg(long, default_value_t = 20)]
    bits_log2: u32,
    /// Densities to run, each a probability that a bit is set.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.01")]
    densities: Vec<f64>,
    /// Terms ANDed by each query.
    #[arg(long, default_value_t = 3)]
    terms: usize,
    /// Vids ORed by each term in the main table.
    #[arg(long, default_value_t = 64)]
    vids_per_term: usize,
    /// Queries in flight at once, for every system.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Queries in the list each system runs per round.
    #[arg(long, default_value_t = 300)]
    queries: usize,
    /// Rounds (each system runs the whole list once per round).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Unmeasured queries before each system's run.
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Vids per term of the chart's points (empty: no chart).
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,128")]
    chart_vids: Vec<usize>,
    /// Queries per system per chart point.
    #[arg(long, default_value_t = 150)]
    chart_queries: usize,
    /// Seed of the vectors and queries.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The Redis server program.
    #[arg(long, default_value = "redis-server")]
    redis_server: String,
    /// Where to write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where to draw the chart (SVG).
    #[arg(long)]
    chart: Option<PathBuf>,
}

/// The systems, in table order.
const SYSTEMS: [&str; 4] = ["redis", "bitfold", "roaring", "roof"];

/// What one system did over all rounds of one workload.
#[derive(Debug, Clone, Serialize)]
struct Figures {
    queries_per_second: f64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    bytes_per_second: f64,
    cpu_ms_per_query: Option<f64>,
    rounds: Vec<f64>,
}

/// One workload's results.
#[derive(Debug, Serialize)]
struct Outcome {
    density: f64,
    vids_per_term: usize,
    queries: usize,
    bytes_per_query: f64,
    systems: Vec<(String, Figures)>,
    /// Medians over rounds of the per-round ratios.
    bitfold_over_redis: f64,
    bitfold_over_roaring: f64,
    bitfold_over_roof: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    redis_version: String,
    slaves: usize,
    policy: String,
    vectors: u64,
    bits: u64,
    terms: usize,
    concurrency: usize,
    rounds: usize,
    seed: u64,
    table: Vec<Outcome>,
    chart: Vec<Outcome>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.densities.is_empty() || args.rounds == 0 || args.queries == 0 || args.concurrency == 0 {
        bail!("--densities, --rounds, --queries and --concurrency must not be empty or zero");
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
        print_outcome(&args, &server, &outcome);
        report.table.push(outcome);
        for &vids_per_term in &args.chart_vids {
            let shape = Shape {
                terms: args.terms,
                vids_per_term,
            };
            eprintln!("chart point: {} vids per term", vids_per_term);
            report
                .chart
                .push(systems.compare(&args, shape, args.chart_queries, 1)?);
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.chart
        && !report.chart.is_empty()
    {
        chart(path, &report)?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}

/// The same data set loaded into every system.
struct Systems<'s> {
    redis: &'s redis::Server,
    bitfold: cluster::Cluster,
    _bitfold_dir: tempfile::TempDir,
    vectors: Vec<VectorBuf>,
    roaring: Vec<RoaringBitmap>,
    sizes: Vec<u64>,
    vids: Vec<u64>,
    density: f64,
    seed: u64,
}

impl<'s> Systems<'s> {
    fn load(args: &Args, set: &DataSet, redis: &'s redis::Server) -> anyhow::Result<Systems<'s>> {
        let vectors: Vec<VectorBuf> = (0..set.vectors)
            .into_par_iter()
            .map(|i| set.vector(i))
            .collect();
        let sizes = vectors.iter().map(|v| part_bytes(&v.as_part())).collect();
        let bytes_per_vector = (set.bits / 8) as usize;

        eprintln!("loading Redis");
        let mut connection = Redis::connect(&redis.addr)?;
        connection.send(&[b"FLUSHALL"])?;
        for (chunk_start, chunk) in vectors.chunks(64).enumerate() {
            let dense: Vec<(String, Vec<u8>)> = chunk
                .par_iter()
                .enumerate()
                .map(|(j, v)| {
                    (
                        key(set.vid((chunk_start * 64 + j) as u64)),
                        dense_bytes(&v.as_part(), bytes_per_vector),
                    )
                })
                .collect();
            for (name, bytes) in &dense {
                connection.send(&[b"SET", name.as_bytes(), bytes])?;
            }
            connection.flush()?;
            connection.read_replies(dense.len() + usize::from(chunk_start == 0))?;
        }

        eprintln!("loading bitfold ({} slaves)", args.slaves);
        let dir = tempfile::tempdir()?;
        let bitfold = cluster::Cluster::start(dir.path(), args.slaves, args.policy)?;
        let client = Client::connect(&bitfold.master)?;
        let per_batch = ((64 << 20) / bytes_per_vector.max(1)).max(1);
        for (b, batch) in vectors.chunks(per_batch).enumerate() {
            let parts: Vec<(u64, VectorPart<'_>)> = batch
                .iter()
                .enumerate()
                .map(|(j, v)| (set.vid((b * per_batch + j) as u64), v.as_part()))
                .collect();
            client.import(&parts).context("cannot load bitfold")?;
        }

        eprintln!("building roaring-rs bitmaps");
        let roaring = vectors
            .par_iter()
            .map(|v| {
                RoaringBitmap::from_lsb0_bytes(0, &dense_bytes(&v.as_part(), bytes_per_vector))
            })
            .collect();
        Ok(Systems {
            redis,
            bitfold,
            _bitfold_dir: dir,
            vectors,
            roaring,
            sizes,
            vids: set.vids(),
            density: set.density,
            seed: set.seed,
        })
    }

    /// Runs `rounds` rounds of every system over `count` queries of `shape`.
    fn compare(
        &self,
        args: &Args,
        shape: Shape,
        count: usize,
        rounds: usize,
    ) -> anyhow::Result<Outcome> {
        let queries = dataset::queries(self.vectors.len(), shape, count, self.seed)
            .map_err(anyhow::Error::msg)?;
        let plan = Plan {
            concurrency: args.concurrency,
            warmup: args.warmup,
            limit: Limit::Queries(count as u64),
        };
        let mut runs: Vec<Vec<Measured>> = vec![Vec::new(); SYSTEMS.len()];
        let mut cpu: Vec<Duration> = vec![Duration::ZERO; SYSTEMS.len()];
        for round in 0..rounds {
            eprintln!("  round {} of {rounds}", round + 1);
            for (s, system) in SYSTEMS.iter().enumerate() {
                let (measured, used) = self.run(system, &queries, plan)?;
                cpu[s] += used;
                runs[s].push(measured);
            }
            check_answers(&queries, &self.vids, &runs)?;
        }
        let asked = (rounds * (count + args.warmup as usize)) as f64;
        let figures: Vec<Figures> = runs
            .iter()
            .zip(&cpu)
            .enumerate()
            .map(|(s, (runs, cpu))| {
                let measured_cpu = SYSTEMS[s] != "roof";
                figures(runs, measured_cpu.then(|| cpu.as_secs_f64() * 1e3 / asked))
            })
            .collect();
        let ratio = |a: usize, b: usize| {
            median(
                runs[a]
                    .iter()
                    .zip(&runs[b])
                    .map(|(x, y)| x.rate() / y.rate())
                    .collect(),
            )
        };
        let bytes: u64 = queries.iter().map(|q| q.bytes(&self.sizes)).sum();
        Ok(Outcome {
            density: self.density,
            vids_per_term: shape.vids_per_term,
            queries: count,
            bytes_per_query: bytes as f64 / count as f64,
            bitfold_over_redis: ratio(1, 0),
            bitfold_over_roaring: ratio(1, 2),
            bitfold_over_roof: ratio(1, 3),
            systems: SYSTEMS.iter().map(|s| s.to_string()).zip(figures).collect(),
        })
    }

    /// One run of `system` over `queries`, and the CPU time it took.
    fn run(
        &self,
        system: &str,
        queries: &[Query],
        plan: Plan,
    ) -> anyhow::Result<(Measured, Duration)> {
        let weigh = |i: usize| queries[i].bytes(&self.sizes);
        let cpu_before = self.cpu(system)?;
        let measured = match system {
            "redis" => {
                let next = AtomicUsize::new(0);
                harness::run(
                    queries.len(),
                    plan,
                    || {
                        let prefix = format!("tmp{}", next.fetch_add(1, Ordering::Relaxed));
                        Ok::<_, anyhow::Error>((Redis::connect(&self.redis.addr)?, prefix))
                    },
                    |(connection, prefix), i| {
                        redis_count(connection, prefix, &self.vids, &queries[i])
                    },
                    weigh,
                    |_| {},
                )?
            }
            "bitfold" => {
                let vids = &self.vids;
                harness::run(
                    queries.len(),
                    plan,
                    || Client::connect(&self.bitfold.master).map_err(anyhow::Error::from),
                    |client, i| {
                        let message = queries[i].message(vids);
                        match client.query(&message, Format::Count)? {
                            Answer::Count(answer) => Ok(Reply { answer, bytes: 0 }),
                            _ => bail!("bitfold answered {message} with a vector, not a count"),
                        }
                    },
                    weigh,
                    |_| {},
                )?
            }
            "roaring" => harness::run(
                queries.len(),
                plan,
                || Ok::<_, anyhow::Error>(()),
                |(), i| {
                    let terms: Vec<RoaringBitmap> = queries[i]
                        .terms
                        .iter()
                        .map(|t| self.roaring[t.clone()].iter().union())
                        .collect();
                    Ok(Reply {
                        answer: terms.iter().intersection().len(),
                        bytes: 0,
                    })
                },
                weigh,
                |_| {},
            )?,
            _ => harness::run(
                queries.len(),
                // Each query is read with every core, one query at a time.
                Plan {
                    concurrency: 1,
                    ..plan
                },
                || Ok::<_, anyhow::Error>(()),
                |(), i| {
                    let parts: Vec<VectorPart<'_>> = queries[i]
                        .terms
                        .iter()
                        .flat_map(|t| self.vectors[t.clone()].iter().map(VectorBuf::as_part))
                        .collect();
                    Ok(Reply {
                        answer: read_roof_parallel(&parts),
                        bytes: 0,
                    })
                },
                weigh,
                |_| {},
            )?,
        };
        Ok((measured, self.cpu(system)?.saturating_sub(cpu_before)))
    }

    /// CPU time `system` has used: the Redis server's, or this process's
    /// (where bitfold's cluster and clients and roaring-rs run).
    fn cpu(&self, system: &str) -> anyhow::Result<Duration> {
        match system {
            "redis" => self.redis.cpu(),
            _ => Ok(process_cpu()),
        }
    }
}

/// The Redis key of vector `vid`.
fn key(vid: u64) -> String {
    format!("v{vid}")
}

/// The vector's dense bytes, `len` long (Redis strings of equal length).
fn dense_bytes(part: &VectorPart<'_>, len: usize) -> Vec<u8> {
    let parts = [*part];
    let mut words = vec![0u64; len.div_ceil(8)];
    let used = words::word_len(&parts);
    words::write_words(&parts, &mut words[..used]);
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.truncate(len);
    bytes
}

/// Redis's most keys per `BITOP` on its fast path.
const REDIS_FAST_KEYS: usize = 16;

/// One query in Redis, pipelined: per term, `BITOP OR` of at most 16 keys
/// at a time, then of the groups (again by 16); `BITOP AND` of the terms;
/// `BITCOUNT`. Scratch keys are the connection's own.
fn redis_count(
    connection: &mut Redis,
    prefix: &str,
    vids: &[u64],
    query: &Query,
) -> anyhow::Result<Reply> {
    let mut commands = 0;
    let mut terms = Vec::with_capacity(query.terms.len());
    for (t, term) in query.terms.iter().enumerate() {
        let mut keys: Vec<String> = term.clone().map(|i| key(vids[i])).collect();
        let mut level = 0;
        while keys.len() > 1 {
            let mut next = Vec::new();
            for (g, group) in keys.chunks(REDIS_FAST_KEYS).enumerate() {
                let dest = format!("{prefix}:{t}:{level}:{g}");
                let mut command: Vec<&[u8]> = vec![b"BITOP", b"OR", dest.as_bytes()];
                command.extend(group.iter().map(|k| k.as_bytes()));
                connection.send(&command)?;
                commands += 1;
                next.push(dest);
            }
            keys = next;
            level += 1;
        }
        terms.push(keys.pop().expect("a term names at least one vid"));
    }
    let result = format!("{prefix}:and");
    let mut command: Vec<&[u8]> = vec![b"BITOP", b"AND", result.as_bytes()];
    command.extend(terms.iter().map(|k| k.as_bytes()));
    connection.send(&command)?;
    connection.send(&[b"BITCOUNT", result.as_bytes()])?;
    connection.flush()?;
    match connection.read_replies(commands + 2)? {
        Value::Integer(count) => Ok(Reply {
            answer: u64::try_from(count)?,
            bytes: 0,
        }),
        other => bail!("BITCOUNT answered {other:?}"),
    }
}

/// Fails loudly unless Redis, bitfold and roaring-rs gave the same count
/// to every query of every round.
fn check_answers(queries: &[Query], vids: &[u64], runs: &[Vec<Measured>]) -> anyhow::Result<()> {
    for (i, query) in queries.iter().enumerate() {
        let answers: Vec<(&str, Option<u64>)> = SYSTEMS[..3]
            .iter()
            .zip(runs)
            .flat_map(|(name, runs)| runs.iter().map(move |m| (*name, m.answers[i])))
            .collect();
        let first = answers[0].1;
        if first.is_none() || answers.iter().any(|&(_, a)| a != first) {
            bail!(
                "the systems disagree on {}: {answers:?}",
                query.message(vids)
            );
        }
    }
    for (name, runs) in SYSTEMS.iter().zip(runs) {
        if let Some(run) = runs.iter().find(|m| !m.inconsistent.is_empty()) {
            bail!(
                "{name} answered a query differently when it ran it again (query {})",
                run.inconsistent[0]
            );
        }
    }
    Ok(())
}

fn figures(runs: &[Measured], cpu_ms_per_query: Option<f64>) -> Figures {
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
        rounds,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn percent(density: f64) -> String {
    format!("{}%", density * 100.0)
}

fn print_outcome(args: &Args, server: &redis::Server, outcome: &Outcome) {
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
        "| system | queries/s | p50 ms | p95 ms | p99 ms | GB/s read | CPU ms/query |"
    );
    let _ = writeln!(text, "|---|---:|---:|---:|---:|---:|---:|");
    for (name, f) in &outcome.systems {
        let label = match name.as_str() {
            "redis" => format!("Redis {} (BITOP by 16, pipelined)", server.version),
            "bitfold" => format!("bitfold ({} slaves, {}, count)", args.slaves, args.policy),
            "roaring" => "roaring-rs 0.12 (in-process)".to_owned(),
            _ => "memory roof (each query's vectors read, all cores)".to_owned(),
        };
        let cpu = f
            .cpu_ms_per_query
            .map_or("-".to_owned(), |c| format!("{c:.2}"));
        let _ = writeln!(
            text,
            "| {label} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {cpu} |",
            f.queries_per_second,
            f.p50_ms,
            f.p95_ms,
            f.p99_ms,
            f.bytes_per_second / 1e9
        );
    }
    let _ = writeln!(
        text,
        "bitfold / Redis {:.2} (target >= 1.5); bitfold / roaring-rs {:.2} (target >= 0.5); bitfold / roof {:.2}",
        outcome.bitfold_over_redis, outcome.bitfold_over_roaring, outcome.bitfold_over_roof
    );
    let _ = writeln!(
        text,
        "every count agreed: Redis, bitfold and roaring-rs, {} queries x {} rounds",
        outcome.queries, args.rounds
    );
    print!("{text}");
}

/// Draws queries/s against vids per term, one panel per density.
fn chart(path: &std::path::Path, report: &Report) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let mut densities: Vec<f64> = report.chart.iter().map(|o| o.density).collect();
    densities.dedup();
    let root = SVGBackend::new(path, (560 * densities.len() as u32, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, densities.len()));
    let colors = [RED, BLUE, GREEN, BLACK];
    let names = [
        "Redis (BITOP by 16)",
        "bitfold (count)",
        "roaring-rs",
        "memory roof",
    ];
    for (panel, density) in panels.iter().zip(&densities) {
        let points: Vec<&Outcome> = report
            .chart
            .iter()
            .filter(|o| o.density == *density)
            .collect();
        // x is log2 of the vids per term, labelled with the vids themselves.
        let xs: Vec<f64> = points
            .iter()
            .map(|o| (o.vids_per_term as f64).log2())
            .collect();
        let top = points
            .iter()
            .flat_map(|o| o.systems.iter().map(|(_, f)| f.queries_per_second))
            .fold(1.0, f64::max);
        let x0 = xs.iter().copied().fold(f64::MAX, f64::min);
        let x1 = xs.iter().copied().fold(f64::MIN, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "{} vectors of 2^{} bits, {} dense, {} terms, concurrency {}",
                    report.vectors,
                    report.bits.ilog2(),
                    percent(*density),
                    report.terms,
                    report.concurrency
                ),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0 - 0.2..x1 + 0.2, 0.0..top * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("vids per term")
            .y_desc("queries/s")
            .x_labels(xs.len() * 4)
            .x_label_formatter(&|x| {
                let rounded = x.round();
                if (x - rounded).abs() < 0.01 {
                    format!("{:.0}", rounded.exp2())
                } else {
                    String::new()
                }
            })
            .y_labels(12)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (s, color) in colors.iter().enumerate() {
            let series: Vec<(f64, f64)> = points
                .iter()
                .map(|o| {
                    (
                        (o.vids_per_term as f64).log2(),
                        o.systems[s].1.queries_per_second,
                    )
                })
                .collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
                .label(names[s])
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart.draw_series(series.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
