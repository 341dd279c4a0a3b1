//! The same data set loaded into every system, and one run of a system
//! over a list of queries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use bitfold_benches::read_roof_parallel;
use bitfold_client::{Answer, Client, Format, LocalClient};
use bitfold_engine::{VectorBuf, VectorPart, words};
use bitfold_server::local::{LocalCluster, loopback};
use bitfold_workload::dataset::{self, DataSet, Query, Shape, part_bytes};
use bitfold_workload::harness::{self, BenchSettings, Limit, Measured, Reply, process_cpu};
use rayon::prelude::*;
use roaring::{MultiOps, RoaringBitmap};

use crate::Args;
use crate::redis::{self, Redis};
use crate::report::{Figures, Outcome, median};
use crate::system::System;

/// The same data set loaded into every system.
pub struct Systems<'s> {
    redis: &'s redis::Server,
    // Dropped (stopped) before its directory.
    bitfold: LocalCluster,
    _bitfold_dir: tempfile::TempDir,
    vectors: Vec<VectorBuf>,
    roaring: Vec<RoaringBitmap>,
    sizes: Vec<u64>,
    vids: Vec<u64>,
    density: f64,
    seed: u64,
}

impl<'s> Systems<'s> {
    /// Generates `set` and loads it into every system.
    pub fn load(
        args: &Args,
        set: &DataSet,
        redis: &'s redis::Server,
    ) -> anyhow::Result<Systems<'s>> {
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
                        redis::key(set.vid((chunk_start * 64 + j) as u64)),
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
        let (policy, plan) = (args.policy, args.plan);
        let mut cluster = loopback(args.slaves, 1);
        cluster.group = args.group;
        let bitfold = LocalCluster::start(dir.path(), cluster, "127.0.0.1:0", |o| {
            o.policy = policy;
            o.plan = plan;
        })?;
        let client = Client::connect(&bitfold.master_addr().to_string())?;
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
    pub fn compare(
        &self,
        args: &Args,
        shape: Shape,
        count: usize,
        rounds: usize,
    ) -> anyhow::Result<Outcome> {
        let queries = dataset::queries(self.vectors.len(), shape, count, self.seed)
            .map_err(anyhow::Error::msg)?;
        let settings = BenchSettings {
            concurrency: args.concurrency,
            warmup: args.warmup,
            limit: Limit::Queries(count as u64),
        };
        let mut runs: Vec<SystemRuns> = System::ALL
            .into_iter()
            .map(|system| SystemRuns {
                system,
                rounds: Vec::new(),
                cpu: Duration::ZERO,
            })
            .collect();
        let bitfold = Client::connect(&self.bitfold.master_addr().to_string())?;
        let traffic_before = bitfold.traffic()?;
        for round in 0..rounds {
            eprintln!("  round {} of {rounds}", round + 1);
            for run in &mut runs {
                let (measured, used) = self.run(run.system, &queries, settings)?;
                run.cpu += used;
                run.rounds.push(measured);
            }
            check_answers(&queries, &self.vids, &runs)?;
        }
        let asked = (rounds * (count + args.warmup as usize)) as f64;
        let traffic = bitfold.traffic()?.since(traffic_before);
        let rounds_of = |system: System| {
            &runs
                .iter()
                .find(|r| r.system == system)
                .expect("every system ran")
                .rounds
        };
        let ratio = |a: System, b: System| {
            median(
                rounds_of(a)
                    .iter()
                    .zip(rounds_of(b))
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
            bitfold_read_bytes_per_query: traffic.read_bytes as f64 / asked,
            bitfold_sent_bytes_per_query: traffic.sent_bytes as f64 / asked,
            bitfold_over_redis: ratio(System::Bitfold, System::Redis),
            bitfold_over_roaring: ratio(System::Bitfold, System::Roaring),
            bitfold_over_roof: ratio(System::Bitfold, System::Roof),
            systems: runs
                .iter()
                .map(|run| {
                    let per_query = |cpu: Duration| cpu.as_secs_f64() * 1e3 / asked;
                    let cpu_ms = run.system.measures_cpu().then(|| per_query(run.cpu));
                    let client_cpu_ms = run
                        .system
                        .serves_clients()
                        .then(|| per_query(run.rounds.iter().map(|m| m.client_cpu).sum()));
                    (run.system, Figures::new(&run.rounds, cpu_ms, client_cpu_ms))
                })
                .collect(),
        })
    }

    /// One run of `system` over `queries`, and the CPU time the system
    /// took (its clients' is in the run's figures).
    fn run(
        &self,
        system: System,
        queries: &[Query],
        settings: BenchSettings,
    ) -> anyhow::Result<(Measured, Duration)> {
        let weigh = |i: usize| queries[i].bytes(&self.sizes);
        let cpu_before = self.cpu(system)?;
        let measured = match system {
            System::Redis => {
                let next = AtomicUsize::new(0);
                harness::run(
                    queries.len(),
                    settings,
                    || {
                        let prefix = format!("tmp{}", next.fetch_add(1, Ordering::Relaxed));
                        Ok::<_, anyhow::Error>((Redis::connect(&self.redis.addr)?, prefix))
                    },
                    |(connection, prefix), i| {
                        redis::count(connection, prefix, &self.vids, &queries[i])
                    },
                    weigh,
                    |_| {},
                )?
            }
            System::Bitfold => {
                let vids = &self.vids;
                harness::run(
                    queries.len(),
                    settings,
                    || {
                        LocalClient::connect(&self.bitfold.master_addr().to_string())
                            .map_err(anyhow::Error::from)
                    },
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
            System::Roaring => harness::run(
                queries.len(),
                settings,
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
            System::Roof => harness::run(
                queries.len(),
                // Each query is read with every core, one query at a time.
                BenchSettings {
                    concurrency: 1,
                    ..settings
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
        let used = self.cpu(system)?.saturating_sub(cpu_before);
        let own = match system {
            // The cluster runs in this process beside its clients.
            System::Bitfold => used.saturating_sub(measured.client_cpu),
            System::Redis | System::Roaring | System::Roof => used,
        };
        Ok((measured, own))
    }

    /// CPU time `system` has used: the Redis server's, or this process's
    /// (where bitfold's cluster and clients and roaring-rs run).
    fn cpu(&self, system: System) -> anyhow::Result<Duration> {
        match system {
            System::Redis => self.redis.cpu(),
            System::Bitfold | System::Roaring | System::Roof => Ok(process_cpu()),
        }
    }
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

/// Every round of one system over one workload, and the CPU time the
/// system took (without its clients').
struct SystemRuns {
    system: System,
    rounds: Vec<Measured>,
    cpu: Duration,
}

/// Fails loudly unless every system that counts gave the same count to
/// every query of every round.
fn check_answers(queries: &[Query], vids: &[u64], runs: &[SystemRuns]) -> anyhow::Result<()> {
    for (i, query) in queries.iter().enumerate() {
        let answers: Vec<(System, Option<u64>)> = runs
            .iter()
            .filter(|run| run.system.counts())
            .flat_map(|run| run.rounds.iter().map(move |m| (run.system, m.answers[i])))
            .collect();
        let first = answers[0].1;
        if first.is_none() || answers.iter().any(|&(_, a)| a != first) {
            bail!(
                "the systems disagree on {}: {answers:?}",
                query.message(vids)
            );
        }
    }
    for run in runs {
        if let Some(round) = run.rounds.iter().find(|m| !m.inconsistent.is_empty()) {
            bail!(
                "{:?} answered a query differently when it ran it again (query {})",
                run.system,
                round.inconsistent[0]
            );
        }
    }
    Ok(())
}
