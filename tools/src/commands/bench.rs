//! `bitfold bench`: load a data set into a cluster (a local one started for
//! the run, or `--master`), run a workload of large range queries from
//! several clients, and report queries/s, latency percentiles, the bytes of
//! vectors the queries name, and the bytes the slaves read and sent per query.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use bitfold_client::{Answer, Client, Format, LocalClient};
use bitfold_net::tls::Tls;
use bitfold_server::local::LocalCluster;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;

use super::demo::read_vectors;
use super::import::{Action, Destination, import_paths};
use super::load_tls;
use super::local::{cluster_tls, numbered_cluster};
use crate::cli::BenchArgs;
use bitfold_workload::dataset::{self, DataSet, Shape, part_bytes};
use bitfold_workload::harness::{self, BenchSettings, Limit, Measured, Reply, process_cpu};

/// Queries a run makes when neither `--queries` nor `--duration` is given.
const DEFAULT_QUERIES: u64 = 1000;

/// The most distinct queries generated; a longer run asks them again in turn.
const MOST_DISTINCT_QUERIES: u64 = 10_000;

/// Vector bytes generated and sent to the master at a time.
const LOAD_BATCH_BYTES: u64 = 64 << 20;

/// Runs `bitfold bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let settings = BenchSettings {
        concurrency: args.concurrency,
        warmup: args.warmup,
        limit: match args.duration {
            Some(time) => Limit::Time(time),
            None => Limit::Queries(args.queries.unwrap_or(DEFAULT_QUERIES)),
        },
    };
    check_settings(&settings)?;
    let shape = Shape {
        terms: args.terms,
        vids_per_term: args.vids_per_term,
    };
    let generated = DataSet {
        vectors: args.vectors,
        bits: args.bits,
        density: args.density,
        seed: args.seed,
        first_vid: args.first_vid,
    };
    if args.data.is_none() {
        generated.check().map_err(anyhow::Error::msg)?;
    }
    let vectors = match &args.data {
        Some(dir) => count_files(dir)?,
        None => generated.vectors,
    };
    // Refuse an impossible shape before anything is started or loaded.
    dataset::queries(usize::try_from(vectors)?, shape, 0, args.seed).map_err(anyhow::Error::msg)?;

    let prepared = Prepared::start(&args, shape, &generated)?;
    let report = prepared.measure(&args, settings)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report.print(&prepared.description);
    }
    Ok(())
}

/// A cluster with the data set loaded, and the workload's queries.
struct Prepared {
    /// A local cluster serves until it is dropped.
    _local: Option<LocalCluster>,
    _dir: tempfile::TempDir,
    master: String,
    client_tls: Option<Tls>,
    /// The cluster, in words.
    description: String,
    catalog: BenchVectors,
    queries: Vec<dataset::Query>,
    messages: Vec<String>,
    form: Format,
}

impl Prepared {
    /// Starts a local cluster (with mutual TLS on every link with `--tls`)
    /// or uses `--master`, and loads the data set.
    fn start(args: &BenchArgs, shape: Shape, generated: &DataSet) -> anyhow::Result<Prepared> {
        let dir = tempfile::tempdir().context("cannot create a directory for the local cluster")?;
        let mut local = None;
        let mut tls_folder = None;
        let (master, description) = match &args.master {
            Some(master) => (master.clone(), format!("the cluster at {master}")),
            None => {
                let mut config = numbered_cluster(args.slaves, args.replicas, 0)?;
                config.group = args.group;
                config.piece = args.piece;
                let (policy, plan) = (args.policy, args.plan);
                if args.tls {
                    let folder = dir.path().join("tls");
                    cluster_tls(&folder, &config)?;
                    tls_folder = Some(folder);
                }
                let started = local.insert(LocalCluster::start_tls(
                    dir.path(),
                    config,
                    "127.0.0.1:0",
                    tls_folder.as_deref(),
                    |o| {
                        o.policy = policy;
                        o.plan = plan;
                    },
                )?);
                let description = format!(
                    "a local cluster of {} slaves ({policy} coordinators, {plan} plan, group {}, \
                     piece {}{})",
                    args.slaves,
                    bitfold_server::cluster::group_name(args.group),
                    args.piece,
                    if args.tls {
                        ", mutual TLS"
                    } else {
                        ", plain TCP"
                    },
                );
                (started.master_addr().to_string(), description)
            }
        };
        // It loads the data set as well as querying: the admin's folder.
        let client_tls = load_tls(tls_folder.map(|f| f.join(bitfold_certs::ADMIN)).as_deref())?;
        let mut prepared = Prepared {
            _local: local,
            _dir: dir,
            master,
            client_tls,
            description,
            catalog: BenchVectors::default(),
            queries: Vec::new(),
            messages: Vec::new(),
            form: args.form,
        };
        let client = prepared.connect()?;
        prepared.catalog = match &args.data {
            Some(dir) => load_files(dir, prepared.connect()?, args.skip_load)?,
            None => load_generated(generated, &client, args.skip_load)?,
        };
        drop(client);
        prepared.queries = dataset::queries(
            prepared.catalog.vids.len(),
            shape,
            MOST_DISTINCT_QUERIES as usize,
            args.seed,
        )
        .map_err(anyhow::Error::msg)?;
        prepared.messages = prepared
            .queries
            .iter()
            .map(|q| q.message(&prepared.catalog.vids))
            .collect();
        Ok(prepared)
    }

    fn connect(&self) -> anyhow::Result<Client> {
        super::connect_with(&self.master, self.client_tls.as_ref())
    }

    /// A querying thread's own connection, run by that thread.
    fn connect_here(&self) -> anyhow::Result<LocalClient> {
        Ok(match &self.client_tls {
            Some(tls) => LocalClient::connect_tls(&self.master, tls)?,
            None => LocalClient::connect(&self.master)?,
        })
    }

    /// Runs the workload as `settings` say, and reports what it measured.
    fn measure(&self, args: &BenchArgs, settings: BenchSettings) -> anyhow::Result<Report> {
        let list_len = match settings.limit {
            Limit::Queries(count) => (settings.warmup + count).min(MOST_DISTINCT_QUERIES) as usize,
            Limit::Time(_) => self.messages.len(),
        };
        let (form, messages) = (self.form, &self.messages[..list_len]);
        let bar = progress_bar(settings.limit);
        let traffic_before = self.connect()?.traffic()?;
        let cpu_before = process_cpu();
        let measured = harness::run(
            messages.len(),
            settings,
            || self.connect_here(),
            |client, i| {
                let answer = client
                    .query(&messages[i], form)
                    .with_context(|| format!("query {} failed", messages[i]))?;
                // A vector answer is checked by its length: counting its bits
                // here would charge the client's work to the cluster.
                Ok(match answer {
                    Answer::Count(count) => Reply {
                        answer: count,
                        bytes: 0,
                    },
                    Answer::Words(bytes) | Answer::Roaring(bytes) => Reply {
                        answer: bytes.len() as u64,
                        bytes: bytes.len() as u64,
                    },
                })
            },
            |i| self.queries[i].bytes(&self.catalog.sizes),
            |done| bar.set_position(done),
        )?;
        let cpu = process_cpu().saturating_sub(cpu_before);
        let traffic = self.connect()?.traffic()?.since(traffic_before);
        bar.finish_and_clear();
        if let Some(&i) = measured.inconsistent.first() {
            bail!(
                "the cluster answered {} differently on two runs: the answers are not exact",
                self.messages[i]
            );
        }
        let mut report = Report::new(args, &self.catalog, &measured);
        // The warm-up's queries cost the cluster too.
        let asked = (measured.queries + settings.warmup).max(1) as f64;
        report.read_bytes_per_query = traffic.read_bytes as f64 / asked;
        report.sent_bytes_per_query = traffic.sent_bytes as f64 / asked;
        if args.master.is_none() {
            // The whole cluster runs in this process: its CPU time is the cluster's.
            report.cpu_ms_per_query = Some(cpu.as_secs_f64() * 1e3 / asked);
        }
        Ok(report)
    }
}

fn check_settings(settings: &BenchSettings) -> anyhow::Result<()> {
    if settings.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    match settings.limit {
        Limit::Queries(0) => bail!("--queries must be at least 1"),
        Limit::Time(time) if time.is_zero() => bail!("--duration must be more than zero"),
        _ => Ok(()),
    }
}

/// The vectors a workload runs over: vids ascending, with the bytes of each.
#[derive(Default)]
struct BenchVectors {
    vids: Vec<u64>,
    sizes: Vec<u64>,
    /// Bits per vector, or `None` for a data set taken from files.
    bits: Option<u64>,
    density: Option<f64>,
}

/// Generates the data set in batches and (unless `skip`) imports each one.
fn load_generated(set: &DataSet, client: &Client, skip: bool) -> anyhow::Result<BenchVectors> {
    let bar = ProgressBar::new(set.vectors);
    bar.set_style(
        ProgressStyle::with_template(if skip {
            "generating (already loaded) [{bar:40}] {pos}/{len} vectors"
        } else {
            "loading [{bar:40}] {pos}/{len} vectors ({eta})"
        })
        .expect("the progress template is valid")
        .progress_chars("=> "),
    );
    let dense_bytes = set.bits.div_ceil(8).max(1);
    let per_batch = (LOAD_BATCH_BYTES / dense_bytes).clamp(1, set.vectors);
    let mut sizes = Vec::with_capacity(set.vectors as usize);
    let mut first = 0;
    while first < set.vectors {
        let end = (first + per_batch).min(set.vectors);
        let batch: Vec<_> = (first..end)
            .into_par_iter()
            .map(|i| (set.vid(i), set.vector(i)))
            .collect();
        sizes.extend(batch.iter().map(|(_, v)| part_bytes(&v.as_part())));
        if !skip {
            let parts: Vec<_> = batch.iter().map(|(vid, v)| (*vid, v.as_part())).collect();
            client
                .import(&parts)
                .context("cannot load the data set into the cluster")?;
        }
        bar.inc(end - first);
        first = end;
    }
    bar.finish_and_clear();
    Ok(BenchVectors {
        vids: set.vids(),
        sizes,
        bits: Some(set.bits),
        density: Some(set.density),
    })
}

/// The number of `<vid>.roaring` files in `dir`.
fn count_files(dir: &Path) -> anyhow::Result<u64> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    let mut count = 0;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "roaring") {
            count += 1;
        }
    }
    if count == 0 {
        bail!(
            "{} holds no <vid>.roaring files to bench with",
            dir.display()
        );
    }
    Ok(count)
}

/// Reads the `<vid>.roaring` files of `dir` and (unless `skip`) imports them.
fn load_files(dir: &Path, client: Client, skip: bool) -> anyhow::Result<BenchVectors> {
    let vectors = read_vectors(dir)?;
    if !skip {
        let destination = Destination::Master(client);
        import_paths(
            &[dir.to_path_buf()],
            bitfold_engine::import::Format::Roaring,
            &destination,
            Action::Set,
        )?;
    }
    let (vids, sizes) = vectors
        .iter()
        .map(|(vid, vector)| (*vid, part_bytes(&vector.as_part())))
        .unzip();
    Ok(BenchVectors {
        vids,
        sizes,
        bits: None,
        density: None,
    })
}

/// The bar shown while querying: queries done of all, or a spinner for a timed run.
fn progress_bar(limit: Limit) -> ProgressBar {
    match limit {
        Limit::Queries(count) => {
            let bar = ProgressBar::new(count);
            bar.set_style(
                ProgressStyle::with_template(
                    "querying [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)",
                )
                .expect("the progress template is valid")
                .progress_chars("=> "),
            );
            bar
        }
        Limit::Time(time) => {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{{spinner}} querying for {:.0}s: {{pos}} queries ({{per_sec}}, {{elapsed}})",
                    time.as_secs_f64()
                ))
                .expect("the progress template is valid"),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        }
    }
}

/// What a run measured, as printed (and as the `--json` line's fields).
#[derive(Debug, Serialize)]
struct Report {
    system: &'static str,
    master: Option<String>,
    slaves: Option<usize>,
    policy: Option<String>,
    plan: Option<String>,
    /// The local cluster's group (`u64::MAX` for all).
    group: Option<u64>,
    /// The local cluster's bits per piece.
    piece: Option<u64>,
    /// Whether the local cluster ran mutual TLS on every link.
    tls: Option<bool>,
    vectors: usize,
    bits: Option<u64>,
    density: Option<f64>,
    seed: u64,
    terms: usize,
    vids_per_term: usize,
    form: &'static str,
    concurrency: usize,
    queries: u64,
    seconds: f64,
    queries_per_second: f64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    bytes_per_query: f64,
    bitmap_bytes_per_second: f64,
    answer_bytes_per_query: f64,
    answer_bytes_per_second: f64,
    /// Bytes of stored vectors the slaves read per query (aggregates make
    /// it less than `bytes_per_query`, what the queries name).
    read_bytes_per_query: f64,
    /// Bytes the slaves sent to other processes per query.
    sent_bytes_per_query: f64,
    /// CPU time of the local cluster (and the clients) per query, all threads.
    cpu_ms_per_query: Option<f64>,
}

impl Report {
    fn new(args: &BenchArgs, catalog: &BenchVectors, measured: &Measured) -> Report {
        let ms = |percent| measured.percentile(percent).as_secs_f64() * 1e3;
        let local = args.master.is_none();
        Report {
            system: "bitfold",
            master: args.master.clone(),
            slaves: local.then_some(args.slaves),
            policy: local.then(|| args.policy.to_string()),
            plan: local.then(|| args.plan.to_string()),
            group: local.then_some(args.group),
            piece: local.then_some(args.piece),
            tls: local.then_some(args.tls),
            vectors: catalog.vids.len(),
            bits: catalog.bits,
            density: catalog.density,
            seed: args.seed,
            terms: args.terms,
            vids_per_term: args.vids_per_term,
            form: match args.form {
                Format::Count => "count",
                Format::Words => "words",
                Format::Roaring => "roaring",
            },
            concurrency: args.concurrency,
            queries: measured.queries,
            seconds: measured.elapsed.as_secs_f64(),
            queries_per_second: measured.rate(),
            p50_ms: ms(50.0),
            p95_ms: ms(95.0),
            p99_ms: ms(99.0),
            bytes_per_query: measured.bytes as f64 / measured.queries.max(1) as f64,
            bitmap_bytes_per_second: measured.byte_rate(),
            answer_bytes_per_query: measured.answer_bytes as f64 / measured.queries.max(1) as f64,
            answer_bytes_per_second: measured.answer_rate(),
            read_bytes_per_query: 0.0,
            sent_bytes_per_query: 0.0,
            cpu_ms_per_query: None,
        }
    }

    fn print(&self, cluster: &str) {
        let data = match (self.bits, self.density) {
            (Some(bits), Some(density)) => format!(
                "{} vectors of {} bits at {}% density (seed {})",
                self.vectors,
                bits,
                density * 100.0,
                self.seed
            ),
            _ => format!("{} vectors from files", self.vectors),
        };
        println!("bitfold bench on {cluster}: {data}");
        println!(
            "queries: {} terms x {} vids, {} form, {} at a time",
            self.terms, self.vids_per_term, self.form, self.concurrency
        );
        println!("{} queries in {:.2} s:", self.queries, self.seconds);
        println!("  {:.1} queries/s", self.queries_per_second);
        println!(
            "  latency p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
            self.p50_ms, self.p95_ms, self.p99_ms
        );
        let mib = |bytes: f64| bytes / f64::from(1 << 20);
        println!(
            "  {:.2} GB/s of vectors named ({:.1} MiB per query)",
            self.bitmap_bytes_per_second / 1e9,
            mib(self.bytes_per_query)
        );
        println!(
            "  per query, the slaves read {:.2} MiB and sent {:.2} MiB",
            mib(self.read_bytes_per_query),
            mib(self.sent_bytes_per_query)
        );
        if let Some(cpu) = self.cpu_ms_per_query {
            println!("  {cpu:.2} ms of CPU per query (the whole local cluster and its clients)");
        }
        if self.form != "count" {
            println!(
                "  {:.2} GB/s of answers ({} form)",
                self.answer_bytes_per_second / 1e9,
                self.form
            );
        }
    }
}
