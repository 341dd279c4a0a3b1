//! A seeded randomized fault test: one writer, two readers and a nemesis on
//! a cluster of 4 slaves with `replicas = 2`, every operation recorded with
//! its interval and outcome, then a checker ([`model`]) that allows each
//! read only the states the writes before and during it allow; after every
//! fault is undone and the cluster is whole again, each vector read through
//! the master and every slave's own copy must be an allowed final state.
//!
//! The seed fixes the operations and the fault schedule (the interleaving
//! of the threads is the machine's). `BITFOLD_FAULT_SEEDS` (comma-separated)
//! and `BITFOLD_FAULT_SECONDS` (per seed) override the fixed seeds and the
//! short run of the test suite; `scripts/faults` drives long runs.
//!
//! The cluster has one master, or (the second test) three whose records
//! Raft replicates (docs/protocol.md §12): then the nemesis also kills,
//! stops and wipes masters, the leader or a follower, one at a time, and
//! every client is given all three (each in another order, so that some
//! calls go to a follower first and are sent on to the leader).

mod direct;
pub(crate) mod history;
pub(crate) mod layout;
pub(crate) mod model;
mod nemesis;
pub(crate) mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bitfold_client::Client;

use crate::util::Cluster;
use history::{Action, Op, Outcome, Recorder, Seen};
use layout::Layout;

/// The seeds of the test suite's run.
const SUITE_SEEDS: &[u64] = &[1, 2, 3];
/// Seconds of faults per seed in the test suite's run.
const SUITE_SECONDS: f64 = 14.0;
/// The seeds of the test suite's run with three masters: one of each
/// layout ([`Layout::of`]).
const REPLICATED_SEEDS: &[u64] = &[4, 5, 6];
/// Seconds of faults per seed in the test suite's run with three masters.
const REPLICATED_SECONDS: f64 = 7.0;
/// Masters of the replicated run.
const MASTERS: usize = 3;
const SLAVES: usize = 4;
const REPLICAS: usize = 2;
/// How long the cluster may take to be whole again after the faults, at
/// least (a longer run is given half its length).
const HEAL_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the final reads retry errors, in all.
const FINAL_RETRIES: Duration = Duration::from_secs(5);

/// What one seed's run found.
struct Report {
    seed: u64,
    tally: String,
    /// Wrong answers and final-state failures, each with its excerpt.
    findings: Vec<String>,
    /// The findings to show: the first wrong answer of each vid, every other kind.
    shown: Vec<String>,
    wrong_reads: usize,
}

#[test]
fn random_faults_never_give_a_wrong_answer() {
    run_seeds(1, SUITE_SEEDS, SUITE_SECONDS);
}

/// The same with three masters, faults on them too.
#[test]
fn random_faults_with_three_masters_never_give_a_wrong_answer() {
    run_seeds(MASTERS, REPLICATED_SEEDS, REPLICATED_SECONDS);
}

/// Runs the seeds (`BITFOLD_FAULT_SEEDS`, else `suite_seeds`) for
/// `BITFOLD_FAULT_SECONDS` (else `suite_seconds`) each, on a cluster with
/// `masters` masters; fails naming every seed with findings.
fn run_seeds(masters: usize, suite_seeds: &[u64], suite_seconds: f64) {
    let seeds: Vec<u64> = match std::env::var("BITFOLD_FAULT_SEEDS") {
        Ok(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .expect("BITFOLD_FAULT_SEEDS: u64s, comma-separated")
            })
            .collect(),
        Err(_) => suite_seeds.to_vec(),
    };
    let seconds: f64 = std::env::var("BITFOLD_FAULT_SECONDS")
        .map(|s| {
            s.parse()
                .expect("BITFOLD_FAULT_SECONDS: a number of seconds")
        })
        .unwrap_or(suite_seconds);
    let mut failed = Vec::new();
    let mut wrong = 0;
    for &seed in &seeds {
        let layout = Layout::of(seed).toml().replace('\n', " ");
        println!("faults | seed {seed} | masters {masters} | {layout}| {seconds} s of faults");
        let report = run(seed, masters, Duration::from_secs_f64(seconds));
        println!("{}", report.tally);
        for finding in &report.shown {
            println!("{finding}\n");
        }
        wrong += report.wrong_reads;
        if !report.findings.is_empty() {
            failed.push(report);
        }
    }
    println!(
        "faults summary | masters {masters} | seeds {} | failing seeds {} {:?} | wrong answers {wrong} | findings {}",
        seeds.len(),
        failed.len(),
        failed.iter().map(|r| r.seed).collect::<Vec<_>>(),
        failed.iter().map(|r| r.findings.len()).sum::<usize>()
    );
    assert!(
        failed.is_empty(),
        "{}",
        failed
            .iter()
            .map(|r| format!(
                "seed {} ({} findings; rerun with BITFOLD_FAULT_SEEDS={}):\n{}\n{}",
                r.seed,
                r.findings.len(),
                r.seed,
                r.tally,
                r.shown
                    .iter()
                    .take(4)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n\n")
            ))
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

/// One seed, on a cluster of `masters` masters: the run under faults,
/// healing, the final reads, the check.
fn run(seed: u64, masters: usize, length: Duration) -> Report {
    let layout = Layout::of(seed);
    let mut cluster = if masters == 1 {
        Cluster::start_laid_out(SLAVES, REPLICAS, nemesis::MASTER_ARGS, &layout.toml())
    } else {
        Cluster::start_replicated(
            SLAVES,
            REPLICAS,
            masters,
            nemesis::MASTER_ARGS,
            &layout.toml(),
        )
    };
    if masters > 1 {
        // Every master a voting member before the first fault: one that
        // started last may be joining, and a fault then would leave no
        // majority.
        let client = workload::client(&cluster.master_addr());
        nemesis::wait_masters_whole(&cluster, &client).expect("the masters are whole at start");
    }
    // Each client is given the masters starting at another one.
    let addrs: Vec<String> = (0..3).map(|k| rotated(&cluster, k)).collect();
    let recorder = Recorder::new();
    let stop = AtomicBool::new(false);
    let nemesis_stop = AtomicBool::new(false);
    let mut faults = [0; nemesis::KINDS.len()];
    thread::scope(|scope| {
        // The clients stop when the nemesis does, even if it panics.
        let _stop = StopOnDrop(&stop);
        scope.spawn(|| workload::writer(&workload::client(&addrs[0]), seed, &recorder, &stop));
        for (k, who) in ["reader0", "reader1"].into_iter().enumerate() {
            let (addr, recorder, stop) = (&addrs[k + 1], &recorder, &stop);
            scope.spawn(move || {
                workload::reader(&workload::client(addr), seed, who, recorder, stop)
            });
        }
        let deadline = Instant::now() + length;
        let nemesis_stop = &nemesis_stop;
        scope.spawn(move || {
            while Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            nemesis_stop.store(true, Ordering::Release);
        });
        faults = nemesis::run(&mut cluster, seed, &recorder, nemesis_stop);
    });
    let mut findings = Vec::new();
    let patience = HEAL_TIMEOUT.max(length / 2);
    let healed = recorder.record(
        "nemesis",
        Action::Fault("heal".into()),
        || match nemesis::heal(&mut cluster).and_then(|()| wait_whole(&cluster, patience)) {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::Failed(e),
        },
    );
    if let Outcome::Failed(why) = &healed {
        findings.push(format!(
            "seed {seed}: the cluster was not whole after healing: {why}"
        ));
    }
    // Every vector through the master: an error is retried, for a while.
    let client = Client::connect(&cluster.master_addr()).expect("the master accepts a client");
    let mut unavailable = 0;
    let retries = Instant::now() + FINAL_RETRIES;
    for vid in 0..workload::VIDS {
        loop {
            let got = workload::read(&client, &recorder, "final", Action::Point(vid), layout);
            match got {
                Outcome::Failed(e) if Instant::now() > retries => {
                    unavailable += 1;
                    findings.push(format!(
                        "seed {seed}: P:{vid} still fails after healing (retried for {} s): {e}",
                        FINAL_RETRIES.as_secs()
                    ));
                    break;
                }
                Outcome::Failed(_) => thread::sleep(Duration::from_millis(500)),
                _ => break,
            }
        }
    }
    let copies: Vec<Result<BTreeMap<u64, Seen>, String>> = cluster
        .slave_addrs
        .iter()
        .map(|a| direct::copies(a, layout))
        .collect();
    let ops = recorder.ops();
    let vids: Vec<u64> = (0..workload::VIDS).collect();
    let verdict = model::check(&ops, &vids);
    let wrong_reads = verdict.wrong.len();
    let mut shown = findings.clone();
    let mut per_vid: BTreeMap<Vec<u64>, usize> = BTreeMap::new();
    for wrong in &verdict.wrong {
        *per_vid.entry(wrong.vids.clone()).or_default() += 1;
    }
    let mut first_of_vid = BTreeSet::new();
    let ranges = verdict.wrong.iter().filter(|w| w.vids.len() > 1).count();
    let mut ranges_shown = 0;
    for wrong in &verdict.wrong {
        let finding = format!("seed {seed}: {}", wrong_answer(&ops, wrong));
        if wrong.vids.len() > 1 {
            ranges_shown += 1;
            if ranges_shown <= 2 {
                shown.push(format!(
                    "{finding}\n  ({} wrong answers to range queries in all)",
                    ranges
                ));
            }
        } else if first_of_vid.insert(wrong.vids.clone()) {
            let more = per_vid[&wrong.vids] - 1;
            shown.push(if more > 0 {
                format!(
                    "{finding}\n  ({more} more wrong answers about vids {:?})",
                    wrong.vids
                )
            } else {
                finding.clone()
            });
        }
        findings.push(finding);
    }
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    if unavailable > 0 {
        kinds.insert("unavailable after healing", unavailable);
    }
    if !matches!(healed, Outcome::Done) {
        kinds.insert("not whole after healing", 1);
    }
    for wrong in &verdict.wrong {
        *kinds.entry(wrong.kind).or_default() += 1;
    }
    let copies = check_copies(seed, layout, &ops, &verdict, &copies);
    if !copies.is_empty() {
        kinds.insert("copies wrong after healing", copies.len());
    }
    shown.extend(copies.iter().cloned());
    findings.extend(copies);
    if !findings.is_empty() {
        save_logs(seed, &cluster);
    }
    Report {
        seed,
        shown,
        tally: format!(
            "{} | by kind {kinds:?}",
            tally(seed, &ops, &faults, &verdict, wrong_reads, findings.len())
        ),
        findings,
        wrong_reads,
    }
}

/// The masters' addresses as a client is given them: with several, the
/// list starting at the `k`th (modulo their number).
fn rotated(cluster: &Cluster, k: usize) -> String {
    let addrs = &cluster.master_addrs;
    if addrs.is_empty() {
        return cluster.master_addr();
    }
    let k = k % addrs.len();
    addrs[k..]
        .iter()
        .chain(&addrs[..k])
        .cloned()
        .collect::<Vec<_>>()
        .join(",")
}

/// Writes what the running processes logged into `target/faults/`, one
/// file each (`seed-N-master.log` or `seed-N-m0.log`..., `seed-N-s0.log`,
/// ...), for a seed with findings. (A process restarted during the run
/// logged only since.)
fn save_logs(seed: u64, cluster: &Cluster) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/faults");
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let mut logs = vec![("master".to_string(), cluster.master.as_ref())];
    logs.extend(
        cluster
            .masters
            .iter()
            .enumerate()
            .map(|(i, m)| (format!("m{i}"), m.as_ref())),
    );
    logs.extend(
        cluster
            .slaves
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("s{i}"), s.as_ref())),
    );
    for (name, server) in logs {
        if let Some(server) = server {
            let path = dir.join(format!("seed-{seed}-{name}.log"));
            if std::fs::write(&path, server.log()).is_ok() {
                eprintln!("seed {seed}: {name}'s log is in {}", path.display());
            }
        }
    }
}

/// Sets its flag when dropped.
pub(crate) struct StopOnDrop<'a>(pub(crate) &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Waits until the master says every slave is up, no vector lacks a copy
/// or is lost, and no move is in progress (and, with several masters, that
/// every one votes and one leads), within `patience`. The cluster
/// must get there by itself (re-replication is automatic, docs/protocol.md
/// §9): `rebalance` is run only for a slave still down after 3 s (one
/// replaced while the master was away is reached at its new address only
/// through it) or a move left in progress.
fn wait_whole(cluster: &Cluster, patience: Duration) -> Result<(), String> {
    let client = Client::connect(&cluster.master_addr()).map_err(|e| e.to_string())?;
    let started = Instant::now();
    nemesis::wait_masters_whole(cluster, &client)?;
    let mut last = String::new();
    while started.elapsed() < patience {
        let status = client.status().map_err(|e| e.to_string());
        let placement = client.placement().map_err(|e| e.to_string());
        let down = status.as_ref().map_or(true, |s| s.iter().any(|s| !s.up));
        match (status, placement) {
            (Ok(_), Ok(p)) if !down && p.under_replicated == 0 && p.lost == 0 && !p.moving => {
                return Ok(());
            }
            (Ok(_), Ok(p)) if p.moving || (down && started.elapsed() > Duration::from_secs(3)) => {
                if let Err(e) = nemesis::rebalance(&client) {
                    last = e;
                }
            }
            (s, p) => last = format!("status {s:?}, placement {p:?}"),
        }
        thread::sleep(Duration::from_millis(200));
    }
    Err(format!("not whole within {} s: {last}", patience.as_secs()))
}

/// After healing: every owner of a vid (of each of its pieces, where the
/// layout cuts vectors) holds the same allowed state as the master
/// answered, and no slave holds a vector or piece it does not own or of a
/// vector that does not exist. A piece that holds none of the answer's
/// bits may be absent (it was never written) or empty (cleared).
fn check_copies(
    seed: u64,
    layout: Layout,
    ops: &[Op],
    verdict: &model::Verdict,
    copies: &[Result<BTreeMap<u64, Seen>, String>],
) -> Vec<String> {
    let placement = layout.placement(SLAVES, REPLICAS);
    let cut = layout.pieces() > 1;
    let mut findings = Vec::new();
    for (i, held) in copies.iter().enumerate() {
        if let Err(e) = held {
            findings.push(format!("seed {seed}: s{i}'s copies could not be read: {e}"));
        }
    }
    let last_read = |vid: u64| {
        ops.iter()
            .rev()
            .find(|op| op.who == "final" && matches!(op.action, Action::Point(v) if v == vid))
            .map(|op| op.outcome.clone())
    };
    for vid in 0..workload::VIDS {
        let answered = match last_read(vid) {
            Some(Outcome::Read(seen)) => Some(seen),
            _ => None,
        };
        let allowed = verdict.last.get(&vid).cloned().flatten();
        let mut problems = Vec::new();
        let mut every_owner = BTreeSet::new();
        for piece in 0..layout.pieces() {
            let key = placement.pieces.key(vid, piece);
            let owners = placement.owners(key);
            every_owner.extend(owners.iter().copied());
            let mask = layout.piece_mask(piece);
            let named = if cut {
                format!("piece {piece} of vid {vid}")
            } else {
                format!("vid {vid}")
            };
            let answer = answered.as_ref().map(|seen| match seen {
                Seen::Bits(m) => Seen::Bits(m & mask),
                other => other.clone(),
            });
            for (i, held) in copies.iter().enumerate() {
                let Ok(held) = held else { continue };
                let copy = held.get(&key);
                let owner = owners.contains(&i);
                match (copy, &answer) {
                    (Some(copy), Some(Seen::Missing)) => problems.push(format!(
                        "s{i} holds {copy} of {named}, which the master says does not exist{}",
                        if owner { "" } else { " (and does not own it)" }
                    )),
                    (Some(copy), _) if !owner => {
                        problems.push(format!("s{i} holds {copy} but does not own {named}"))
                    }
                    (None, Some(Seen::Bits(m))) if owner && (*m != 0 || !cut) => {
                        problems.push(format!(
                            "s{i} owns {named} but holds no copy (the master answered {})",
                            history::bits(*m)
                        ))
                    }
                    (Some(copy), Some(answer)) if copy != answer => problems.push(format!(
                        "s{i}'s copy {copy} of {named} differs from the master's answer {answer}"
                    )),
                    _ => {}
                }
                if let (Some(Seen::Bits(m)), Some(allowed)) = (copy, &allowed)
                    && !allowed.iter().any(|s| s.map(|a| a & mask) == Some(*m))
                {
                    problems.push(format!(
                        "s{i}'s copy {} of {named} is no state the writes allow: {}",
                        history::bits(*m),
                        allowed
                            .iter()
                            .map(|&s| history::state(s))
                            .collect::<Vec<_>>()
                            .join(" | ")
                    ));
                }
            }
        }
        if !problems.is_empty() {
            findings.push(format!(
                "seed {seed}: vid {vid} after healing (owners {:?}): {}\n{}",
                every_owner
                    .iter()
                    .map(|o| format!("s{o}"))
                    .collect::<Vec<_>>(),
                problems.join("; "),
                excerpt(ops, &[vid], ops.len() - 1)
            ));
        }
    }
    findings
}

/// A wrong answer, what it should have been, and the history of its vids.
pub(crate) fn wrong_answer(ops: &[Op], wrong: &model::Wrong) -> String {
    let op = &ops[wrong.op];
    format!(
        "WRONG ANSWER ({}) to {} (op #{}, vids {:?}): expected {}\n{}",
        wrong.kind,
        op.action.query(),
        op.id,
        wrong.vids,
        wrong.allowed,
        excerpt(ops, &wrong.vids, op.id)
    )
}

/// The last 10 writes to `vids` before op `upto` ends, the point reads of
/// them since the first of those (a run of reads with one answer shown
/// once), and the faults and rebalances meanwhile, by start.
fn excerpt(ops: &[Op], vids: &[u64], upto: usize) -> String {
    let end = ops[upto].end;
    let on_vids = |op: &Op| vids.iter().any(|&v| op.action.touches(v));
    let writes: Vec<&Op> = ops
        .iter()
        .filter(|op| op.start <= end && op.action.is_write() && on_vids(op))
        .collect();
    let writes = &writes[writes.len().saturating_sub(10)..];
    let from = writes.first().map_or(0, |op| op.start);
    let mut lines: Vec<&Op> = ops
        .iter()
        .filter(|op| op.start <= end && op.end >= from)
        .filter(|op| {
            op.id == upto
                || (op.action.is_write() && on_vids(op))
                || matches!(op.action, Action::Point(_)) && on_vids(op) && vids.len() == 1
                || matches!(op.action, Action::Fault(_) | Action::Rebalance)
        })
        .collect();
    lines.sort_by_key(|op| (op.start, op.id));
    let mut text = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let op = lines[i];
        text.push(format!("    {op}"));
        let same = |other: &Op| {
            matches!(other.action, Action::Point(_))
                && other.id != upto
                && other.action.query() == op.action.query()
                && format!("{:?}", other.outcome) == format!("{:?}", op.outcome)
        };
        let mut run = 0;
        while op.id != upto
            && matches!(op.action, Action::Point(_))
            && i + 1 + run < lines.len()
            && same(lines[i + 1 + run])
        {
            run += 1;
        }
        if run > 0 {
            text.push(format!("    ... and {run} more reads with that answer"));
        }
        i += 1 + run;
    }
    format!(
        "  history of vid {vids:?} (its last {} writes, its point reads, and the faults meanwhile):\n{}",
        writes.len(),
        text.join("\n")
    )
}

/// One line of what a seed's run did and found.
fn tally(
    seed: u64,
    ops: &[Op],
    faults: &[usize],
    verdict: &model::Verdict,
    wrong: usize,
    findings: usize,
) -> String {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for op in ops {
        *kinds
            .entry(match op.action {
                Action::Import(_) => "imports",
                Action::Clear(_) => "clears",
                Action::Delete(_) => "deletes",
                Action::Point(_) => "P",
                Action::Range(_) => "R",
                Action::Rebalance => "rebalances",
                Action::Fault(_) => "faults",
            })
            .or_default() += 1;
        *outcomes
            .entry(match (&op.outcome, op.action.is_write()) {
                (Outcome::Done, _) => "ok",
                (Outcome::Refused(_), _) => "refused",
                (Outcome::Recorded(_), _) => "recorded",
                (Outcome::Unknown(_), _) => "unknown",
                (Outcome::Read(_), _) => "answered",
                (Outcome::Failed(_), false) => "errors",
                (Outcome::Failed(_), true) => "errors",
            })
            .or_default() += 1;
    }
    let faults: Vec<String> = nemesis::KINDS
        .iter()
        .zip(faults)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let vids_written: BTreeSet<u64> = ops
        .iter()
        .filter(|op| op.action.is_write())
        .flat_map(|op| (0..workload::VIDS).filter(|&v| op.action.touches(v)))
        .collect();
    format!(
        "faults | seed {seed} | ops {} {:?} | outcomes {:?} | faults {} | vids written {} | \
         reads checked {} | lost track {} | wrong answers {wrong} | findings {findings}",
        ops.len(),
        kinds,
        outcomes,
        faults.join(", "),
        vids_written.len(),
        verdict.checked,
        verdict.lost_track,
    )
}
