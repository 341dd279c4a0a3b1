//! Three masters whose records Raft replicates (issue 41), each a real
//! `bitfold master --cluster FILE --name mI` process, over three slaves
//! with `replicas = 2`: the leader killed (-9) or paused (SIGSTOP) under a
//! writer and two readers, two masters of three down, and `bitfold
//! status` after a kill. Every write and read goes into one history
//! (`faults::history`) and is checked by the randomized fault test's
//! checker (`faults::model`): a read may see only the states the writes
//! before and during it allow (an acknowledged write inside its interval,
//! a refused one never, one of unknown outcome in order or never), and
//! after the faults every vector read through the new leader must be one
//! the writes allow, so an acknowledged write that was lost is found.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bitfold_client::{Client, Error, ErrorKind, Format};

use crate::faults::StopOnDrop;
use crate::faults::history::{Action, Op, Outcome, Recorder};
use crate::faults::layout::Layout;
use crate::faults::{model, workload, wrong_answer};
use crate::util::{Cluster, QUICK_MASTER, bitfold, stderr, stdout};

const SLAVES: usize = 3;
const REPLICAS: usize = 2;
const MASTERS: usize = 3;
/// The longest a test waits for a master to lead and serve (an election
/// takes 600-1200 ms, then the leader starts from the records): generous,
/// the machine may be busy; only a bound, never a measure.
const ELECTION: Duration = Duration::from_secs(30);
/// How long the clients run between faults.
const LOAD: Duration = Duration::from_millis(1500);
/// How long the final reads retry an error, in all.
const FINAL_RETRIES: Duration = Duration::from_secs(15);
/// The vids of the load (the fault test's writer and readers).
const VIDS: u64 = workload::VIDS;

/// A cluster of three slaves and three masters placing by `seed`'s layout.
fn start(seed: u64) -> Cluster {
    let layout = Layout::of(seed).toml();
    Cluster::start_replicated(SLAVES, REPLICAS, MASTERS, QUICK_MASTER, &layout)
}

/// A client of every master, waiting `timeout` for one to answer and
/// trying them in turn for `failover` while none leads.
fn client_of(addr: &str, timeout: Duration, failover: Duration) -> Client {
    let mut client = Client::connect(addr).expect("a master takes the connection");
    client.set_timeout(timeout);
    client.set_failover(failover);
    client
}

/// Runs the fault test's writer and two readers through `clients`, until
/// `stop` is set or the guard returned is dropped (as when the test fails).
fn spawn_load<'s>(
    scope: &'s thread::Scope<'s, '_>,
    clients: &'s [Client; 3],
    seed: u64,
    recorder: &'s Recorder,
    stop: &'s AtomicBool,
) -> StopOnDrop<'s> {
    let [writer, reader0, reader1] = clients;
    scope.spawn(move || workload::writer(writer, seed, recorder, stop));
    scope.spawn(move || workload::reader(reader0, seed, "reader0", recorder, stop));
    scope.spawn(move || workload::reader(reader1, seed, "reader1", recorder, stop));
    StopOnDrop(stop)
}

/// Records a fault (`what`) at this instant; returns its time on the
/// recorder's clock.
fn fault(recorder: &Recorder, what: String) -> u64 {
    eprintln!("failover: {what}");
    let at = recorder.now();
    recorder.record("nemesis", Action::Fault(what), || Outcome::Done);
    at
}

/// Asks `P:0` through `client` until a master answers (a vector or
/// `notFound`), for up to [`ELECTION`]; how long that took. If none
/// answers, fails with the masters' logs.
fn first_answer(
    cluster: &Cluster,
    client: &Client,
    recorder: &Recorder,
    layout: Layout,
) -> Duration {
    let started = Instant::now();
    loop {
        match workload::read(client, recorder, "probe", Action::Point(0), layout) {
            Outcome::Read(_) => return started.elapsed(),
            Outcome::Failed(e) if started.elapsed() >= ELECTION => assert_no_findings(
                cluster,
                &[format!(
                    "no master answered a query within {ELECTION:?} of the fault: {e}"
                )],
            ),
            _ => thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Waits until a write of the writer that started at or after `since`
/// (on the recorder's clock) is acknowledged; how long after `since` it
/// ended. If none is within [`ELECTION`], fails with the writer's last
/// operations and the masters' logs.
fn first_write_after(cluster: &Cluster, recorder: &Recorder, since: u64) -> Duration {
    let deadline = Instant::now() + ELECTION;
    loop {
        let ops = recorder.ops();
        let done = ops
            .iter()
            .filter(|op| op.who == "writer" && op.start >= since)
            .filter(|op| matches!(op.outcome, Outcome::Done) && op.action.is_write())
            .map(|op| op.end)
            .min();
        if let Some(end) = done {
            return Duration::from_nanos(end - since);
        }
        if Instant::now() >= deadline {
            let last: Vec<String> = ops
                .iter()
                .filter(|op| op.who == "writer" || op.who == "nemesis")
                .rev()
                .take(8)
                .map(Op::to_string)
                .collect();
            let finding = format!(
                "no write started after the fault (at {:.1} ms) was acknowledged within \
                 {ELECTION:?}; now {:.1} ms; the writer's last operations, newest first:\n{}",
                since as f64 / 1e6,
                recorder.now() as f64 / 1e6,
                last.join("\n")
            );
            assert_no_findings(cluster, &[finding]);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Reads every vid of `vids` through the leader (an error retried for up
/// to [`FINAL_RETRIES`]), then checks the whole history: each wrong
/// answer, and each vid the final reads could not answer, as a finding.
fn check(cluster: &Cluster, recorder: &Recorder, layout: Layout, vids: &[u64]) -> Vec<String> {
    let client = client_of(
        &cluster.master_addr(),
        Duration::from_secs(10),
        Duration::from_secs(5),
    );
    let mut findings = Vec::new();
    let retries = Instant::now() + FINAL_RETRIES;
    for &vid in vids {
        loop {
            match workload::read(&client, recorder, "final", Action::Point(vid), layout) {
                Outcome::Failed(e) if Instant::now() > retries => {
                    findings.push(format!("P:{vid} still fails after the faults: {e}"));
                    break;
                }
                Outcome::Failed(_) => thread::sleep(Duration::from_millis(200)),
                _ => break,
            }
        }
    }
    let ops = recorder.ops();
    let verdict = model::check(&ops, vids);
    eprintln!("failover: {}", tally(&ops, &verdict));
    findings.extend(verdict.wrong.iter().map(|w| wrong_answer(&ops, w)));
    findings
}

/// What a run did: operations by kind and outcome, reads checked.
fn tally(ops: &[Op], verdict: &model::Verdict) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for op in ops {
        let kind = match op.action {
            Action::Import(_) => "import",
            Action::Clear(_) => "clear",
            Action::Delete(_) => "delete",
            Action::Point(_) => "P",
            Action::Range(_) => "R",
            Action::Rebalance => "rebalance",
            Action::Fault(_) => continue,
        };
        let outcome = match op.outcome {
            Outcome::Done => "ok",
            Outcome::Refused(_) => "refused",
            Outcome::Recorded(_) => "recorded",
            Outcome::Unknown(_) => "unknown",
            Outcome::Read(_) => "answered",
            Outcome::Failed(_) => "failed",
        };
        *counts.entry(format!("{kind} {outcome}")).or_default() += 1;
    }
    format!(
        "{counts:?} | reads checked {} | lost track {} | wrong {}",
        verdict.checked,
        verdict.lost_track,
        verdict.wrong.len()
    )
}

/// Fails with every finding, and the masters' logs, if there is any.
#[track_caller]
fn assert_no_findings(cluster: &Cluster, findings: &[String]) {
    if findings.is_empty() {
        return;
    }
    for (i, master) in cluster.masters.iter().enumerate() {
        if let Some(master) = master {
            let addr = &cluster.master_addrs[i];
            eprintln!("--- m{i}'s log (at {addr}):\n{}", master.log());
        }
    }
    panic!(
        "{} findings:\n{}",
        findings.len(),
        findings
            .iter()
            .take(6)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

/// kill -9 of the leader under a writer and two readers, twice (the first
/// leader restarted, as a follower, before the second is killed): queries
/// and writes go on on a new leader, no answer is wrong, and every
/// acknowledged write is there at the end. The time from each kill to the
/// first answered query is measured and printed (bounded only by
/// [`ELECTION`]).
#[test]
fn the_leader_killed_under_load_is_replaced_and_nothing_is_lost_or_wrong() {
    let seed = 1;
    let layout = Layout::of(seed);
    let mut cluster = start(seed);
    let mut leader = cluster.leader(ELECTION).expect("a master leads");
    let addr = cluster.master_addr();
    let (timeout, failover) = (Duration::from_secs(40), Duration::from_secs(5));
    let clients = [(); 3].map(|()| client_of(&addr, timeout, failover));
    let probe = client_of(&addr, timeout, failover);
    let recorder = Recorder::new();
    let stop = AtomicBool::new(false);
    let mut gaps = Vec::new();
    thread::scope(|scope| {
        let _stop = spawn_load(scope, &clients, seed, &recorder, &stop);
        for _ in 0..2 {
            thread::sleep(LOAD);
            let killed = recorder.now();
            cluster.kill_master_at(leader);
            fault(&recorder, format!("kill -9 master m{leader}, the leader"));
            let query = first_answer(&cluster, &probe, &recorder, layout);
            let write = first_write_after(&cluster, &recorder, killed);
            let next = cluster.leader(ELECTION).expect("a master leads again");
            eprintln!(
                "failover: m{leader} killed: m{next} leads; the first query was answered after \
                 {} ms with no leader, the first write acknowledged after {} ms",
                query.as_millis(),
                write.as_millis()
            );
            assert_ne!(next, leader, "the killed master cannot lead");
            gaps.push(query);
            cluster.restart_master_at(leader);
            fault(&recorder, format!("master m{leader} restarted"));
            cluster.wait_masters_voting(ELECTION);
            leader = next;
        }
        thread::sleep(LOAD);
        stop.store(true, Ordering::Release);
    });
    let vids: Vec<u64> = (0..VIDS).collect();
    let findings = check(&cluster, &recorder, layout, &vids);
    eprintln!(
        "failover: time with no leader after each kill -9 (to the first answered query): {:?} ms",
        gaps.iter().map(Duration::as_millis).collect::<Vec<_>>()
    );
    assert_no_findings(&cluster, &findings);
}

/// The leader paused (SIGSTOP) for longer than an election, then resumed:
/// meanwhile a new leader serves the writer and the readers (whose calls
/// to the paused one time out, `set_timeout`); once resumed the old one
/// steps down (it answers `notLeader` and says it no longer serves, and
/// the status lists one leader), and the writes sent to it while it was
/// paused (an import of a new vector and a clear of an existing one, from
/// clients given only it) are refused or present, never applied late over
/// later writes; nothing acknowledged is lost, no answer is wrong.
#[test]
fn a_paused_leader_steps_down_and_its_late_writes_are_refused_or_present() {
    const PAUSE: Duration = Duration::from_secs(3);
    const CALL: Duration = Duration::from_millis(1500);
    // Vids the load never writes: the writes sent to the paused leader.
    const LATE_IMPORT: u64 = VIDS + 6;
    const LATE_CLEAR: u64 = VIDS + 7;
    let seed = 2;
    let layout = Layout::of(seed);
    let cluster = start(seed);
    let old = cluster.leader(ELECTION).expect("a master leads");
    let old_addr = cluster.master_addrs[old].clone();
    let addr = cluster.master_addr();
    let clients = [(); 3].map(|()| client_of(&addr, CALL, Duration::from_secs(10)));
    let recorder = Recorder::new();
    let main = client_of(&addr, Duration::from_secs(10), Duration::from_secs(10));
    let existing = workload::write(
        &main,
        &recorder,
        "main",
        Action::Import(vec![(LATE_CLEAR, 0xff)]),
        layout,
    );
    assert!(matches!(existing, Outcome::Done), "{existing:?}");
    // Clients of the paused leader alone, which wait for it.
    let only_old = [(); 2].map(|()| client_of(&old_addr, ELECTION, ELECTION));
    let stop = AtomicBool::new(false);
    let mut late = Vec::new();
    thread::scope(|scope| {
        let _stop = spawn_load(scope, &clients, seed, &recorder, &stop);
        thread::sleep(LOAD);
        cluster.masters[old]
            .as_ref()
            .expect("the leader runs")
            .signal(libc::SIGSTOP);
        let paused = fault(&recorder, format!("SIGSTOP master m{old}, the leader"));
        let recorder = &recorder;
        let import = scope.spawn(|| {
            let import = Action::Import(vec![(LATE_IMPORT, 0x0f0f)]);
            workload::write(&only_old[0], recorder, "late", import, layout)
        });
        let clear = scope.spawn(|| {
            let clear = Action::Clear(vec![(LATE_CLEAR, 0x3c)]);
            workload::write(&only_old[1], recorder, "late", clear, layout)
        });
        // Paused for longer than an election, and until a new leader has
        // answered a read and a write that started after the pause.
        thread::sleep(PAUSE);
        let served = |write: bool| {
            recorder.ops().iter().any(|op| {
                op.start >= paused
                    && op.who != "late"
                    && if write {
                        op.action.is_write() && matches!(op.outcome, Outcome::Done)
                    } else {
                        matches!(op.outcome, Outcome::Read(_))
                    }
            })
        };
        let deadline = Instant::now() + ELECTION;
        while !(served(true) && served(false)) {
            assert!(
                Instant::now() < deadline,
                "no write and read started after the pause were answered within {ELECTION:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
        let new = cluster
            .leader(ELECTION)
            .unwrap_or_else(|e| panic!("no master leads while m{old} is paused: {e}"));
        assert_ne!(new, old, "the paused master cannot lead");
        eprintln!(
            "failover: m{new} served while m{old} was paused, for {} ms",
            Duration::from_nanos(recorder.now() - paused).as_millis()
        );
        cluster.masters[old]
            .as_ref()
            .expect("the leader runs")
            .signal(libc::SIGCONT);
        fault(recorder, format!("SIGCONT master m{old}; m{new} leads"));
        late.push(import.join().expect("the late import returns"));
        late.push(clear.join().expect("the late clear returns"));
        // The old leader steps down: it answers notLeader.
        let asked = client_of(&old_addr, Duration::from_secs(2), Duration::from_secs(2));
        let deadline = Instant::now() + ELECTION;
        loop {
            // Once it knows it no longer leads it sends the call on to the
            // new leader (or, knowing none, answers notLeader): either way
            // not from its own records, as the checks below confirm.
            match asked.query("P:0", Format::Count) {
                Err(Error::Query {
                    kind: ErrorKind::NotLeader,
                    message,
                    ..
                }) => {
                    eprintln!("failover: m{old} once resumed: {message}");
                    break;
                }
                Ok(answer) => {
                    eprintln!("failover: m{old} once resumed sent P:0 on: {answer:?}");
                    break;
                }
                other => assert!(
                    Instant::now() < deadline,
                    "m{old} did not step down within {ELECTION:?}: {other:?}"
                ),
            }
            thread::sleep(Duration::from_millis(50));
        }
        let log = cluster.masters[old]
            .as_ref()
            .expect("it runs")
            .log_once(|l| l.contains(&format!("master m{old} no longer serves")));
        assert!(
            log.contains(&format!("master m{old} no longer serves")),
            "m{old} did not log that it stopped serving:\n{log}"
        );
        let status = main.full_status().expect("the leader answers status");
        let leaders: Vec<&str> = status
            .masters
            .iter()
            .filter(|m| m.state == "leader")
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(leaders.len(), 1, "{:?}", status.masters);
        assert_ne!(leaders[0], format!("m{old}"), "{:?}", status.masters);
        thread::sleep(LOAD);
        stop.store(true, Ordering::Release);
    });
    eprintln!("failover: the writes sent to the paused leader: {late:?}");
    let mut vids: Vec<u64> = (0..VIDS).collect();
    vids.extend([LATE_IMPORT, LATE_CLEAR]);
    let findings = check(&cluster, &recorder, layout, &vids);
    assert_no_findings(&cluster, &findings);
}

/// A follower's data directory lost (the master killed, its directory
/// deleted, the master started again on an empty one) while a writer and
/// two readers go on: it joins as a new member, catching up from a
/// snapshot of the records since the entries it would need are gone from
/// the others' logs (it holds the snapshot file, and no entry before it),
/// and votes: with the leader killed next, it and the third master elect
/// one. No answer is wrong; nothing acknowledged is lost.
#[test]
fn a_master_whose_data_is_lost_joins_again_from_a_snapshot_while_queries_go_on() {
    /// Past the log entries after which a master takes a snapshot and
    /// drops the entries before it (`QuorumOptions::snapshot_every`).
    const PAST_A_SNAPSHOT: u64 = 1_200;
    let seed = 3;
    let layout = Layout::of(seed);
    let mut cluster = start(seed);
    let leader = cluster.leader(ELECTION).expect("a master leads");
    let lost = (leader + 1) % MASTERS;
    let addr = cluster.master_addr();
    let clients = [(); 3].map(|()| client_of(&addr, ELECTION, Duration::from_secs(10)));
    let watch = client_of(&addr, Duration::from_secs(5), Duration::from_secs(10));
    let recorder = Recorder::new();
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let _stop = spawn_load(scope, &clients, seed, &recorder, &stop);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let logged = watch.full_status().ok().and_then(|status| {
                let leader = status.masters.iter().find(|m| m.state == "leader")?;
                Some(leader.log_index)
            });
            if logged.is_some_and(|index| index > PAST_A_SNAPSHOT) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the leader's log never passed {PAST_A_SNAPSHOT} entries: {logged:?}"
            );
            thread::sleep(Duration::from_millis(200));
        }
        cluster.kill_master_at(lost);
        std::fs::remove_dir_all(cluster.master_dir(lost)).expect("the data directory is removed");
        cluster.restart_master_at(lost);
        fault(&recorder, format!("master m{lost}'s data directory lost"));
        cluster.wait_masters_voting(ELECTION);
        thread::sleep(LOAD);
        let raft = cluster.master_dir(lost).join("raft");
        let names: Vec<String> = std::fs::read_dir(&raft)
            .expect("the new member's Raft folder")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert!(
            names.iter().any(|n| n == "snapshot"),
            "the new member holds no snapshot: {names:?}"
        );
        let first = names
            .iter()
            .filter_map(|n| n.strip_prefix("entry-")?.parse::<u64>().ok())
            .min();
        assert!(
            first.is_none_or(|i| i > 1),
            "the new member's log starts at entry {first:?}: it replayed the log, not a snapshot"
        );
        // It votes: the leader killed, it and the third elect one.
        cluster.kill_master_at(leader);
        fault(&recorder, format!("kill -9 master m{leader}, the leader"));
        let next = cluster.leader(ELECTION).expect("a master leads again");
        assert_ne!(next, leader);
        thread::sleep(LOAD);
        stop.store(true, Ordering::Release);
    });
    let vids: Vec<u64> = (0..VIDS).collect();
    let findings = check(&cluster, &recorder, layout, &vids);
    assert_no_findings(&cluster, &findings);
}

/// Two of three masters down (kill -9), first the two followers (the
/// leader is left without a majority), then the leader and a follower:
/// each time a query and a write fail as `unavailable`, naming the two
/// masters that are down, nothing is answered wrong, and starting one of
/// them again brings back service with every acknowledged write.
#[test]
fn with_two_masters_of_three_down_calls_fail_unavailable_naming_them() {
    let seed = 3;
    let layout = Layout::of(seed);
    let mut cluster = start(seed);
    let addr = cluster.master_addr();
    let client = client_of(
        &addr,
        Duration::from_secs(20),
        bitfold_client::DEFAULT_FAILOVER,
    );
    let recorder = Recorder::new();
    for round in 0..2u64 {
        let leader = cluster.leader(ELECTION).expect("a master leads");
        for vid in (0..8).map(|v| v + 8 * round) {
            let import = Action::Import(vec![(vid, 1 << vid | 1)]);
            let written = workload::write(&client, &recorder, "writer", import, layout);
            assert!(matches!(written, Outcome::Done), "{written:?}");
        }
        let followers: Vec<usize> = (0..MASTERS).filter(|&m| m != leader).collect();
        let down = if round == 0 {
            followers.clone()
        } else {
            vec![leader, followers[0]]
        };
        for &m in &down {
            cluster.kill_master_at(m);
            fault(&recorder, format!("kill -9 master m{m}"));
        }
        let names_down = |what: &str, message: &str| {
            for &m in &down {
                let addr = &cluster.master_addrs[m];
                assert!(
                    message.contains(&format!("{addr}: connection refused")),
                    "{what}: the error does not name m{m} ({addr}) as down: {message}"
                );
            }
        };
        // The leader answers (rightly) while its lease from the last
        // majority's answer lasts, half an election timeout; then no more.
        let deadline = Instant::now() + ELECTION;
        let read = loop {
            let read = workload::read(&client, &recorder, "reader", Action::Point(1), layout);
            if matches!(read, Outcome::Failed(_)) || Instant::now() >= deadline {
                break read;
            }
            thread::sleep(Duration::from_millis(100));
        };
        let Outcome::Failed(message) = &read else {
            panic!("a query with two masters of three down: {read:?}")
        };
        eprintln!("failover: a query with m{down:?} down: {message}");
        assert!(message.starts_with("unavailable: "), "{message}");
        names_down("the query", message);
        let import = Action::Import(vec![(20, 1)]);
        let written = workload::write(&client, &recorder, "writer", import, layout);
        let (Outcome::Unknown(message) | Outcome::Refused(message)) = &written else {
            panic!("a write with two masters of three down: {written:?}")
        };
        eprintln!("failover: a write with m{down:?} down: {message}");
        assert!(message.starts_with("unavailable: "), "{message}");
        names_down("the write", message);
        cluster.restart_master_at(down[0]);
        fault(&recorder, format!("master m{} restarted", down[0]));
        cluster.leader(ELECTION).expect("a master leads again");
        let import = Action::Import(vec![(21, 1 + round)]);
        let written = workload::write(&client, &recorder, "writer", import, layout);
        assert!(matches!(written, Outcome::Done), "{written:?}");
        cluster.restart_master_at(down[1]);
        fault(&recorder, format!("master m{} restarted", down[1]));
    }
    let vids: Vec<u64> = (0..VIDS).collect();
    let findings = check(&cluster, &recorder, layout, &vids);
    assert_no_findings(&cluster, &findings);
}

/// After the leader is killed, `bitfold status --master a,b,c` (once a
/// new leader answers) prints one line per master: exactly one `leader`,
/// the killed one `down` (with why), the third `follower`.
#[test]
fn status_after_the_leader_is_killed_shows_one_leader_and_it_down() {
    let mut cluster = Cluster::start_replicated(2, 2, MASTERS, QUICK_MASTER, "group = 1\n");
    let leader = cluster.leader(ELECTION).expect("a master leads");
    cluster.kill_master_at(leader);
    let addr = cluster.master_addr();
    let deadline = Instant::now() + ELECTION;
    let run = loop {
        let run = bitfold(&["status", "--master", &addr]);
        if run.status.success() || Instant::now() >= deadline {
            break run;
        }
        thread::sleep(Duration::from_millis(50));
    };
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    eprintln!("failover: status after m{leader} was killed:\n{text}");
    let masters: Vec<&str> = text.lines().filter(|l| l.starts_with("master ")).collect();
    assert_eq!(masters.len(), MASTERS, "{text}");
    let state = |line: &str| line.split_whitespace().nth(3).unwrap_or("").to_owned();
    let leaders = masters.iter().filter(|l| state(l) == "leader").count();
    assert_eq!(leaders, 1, "{text}");
    let killed = format!("master m{leader} {} down", cluster.master_addrs[leader]);
    assert!(
        masters.iter().any(|l| l.starts_with(&killed)),
        "no `{killed}` line:\n{text}"
    );
    let followers = masters.iter().filter(|l| state(l) == "follower").count();
    assert_eq!(followers, 1, "{text}");
    assert!(
        text.lines()
            .nth(MASTERS)
            .is_some_and(|l| l.starts_with("SLAVE ")),
        "{text}"
    );
}

/// A DBMS given only a follower is answered by the leader: eight queries
/// at once, then an import, queries, a delete and `status`.
#[test]
fn a_follower_sends_its_callers_writes_and_reads_on_to_the_leader() {
    let cluster = start(1);
    let leader = cluster.leader(ELECTION).expect("a master leads");
    // Not m0, whose calls the start's wait for the masters may have sent
    // on already.
    let follower = (1..MASTERS).find(|&i| i != leader).expect("a follower");
    let follower = &cluster.master_addrs[follower];
    // Calls arriving at once, before the follower has a connection to the
    // leader, are all answered: each used to open one, and each opened
    // dropped the one before with the calls under way on it, which then
    // never got an answer.
    let barrier = std::sync::Barrier::new(8);
    thread::scope(|scope| {
        let asked: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let client = client_of(follower, ELECTION, Duration::from_secs(5));
                    barrier.wait();
                    client.query("P:0", Format::Count)
                })
            })
            .collect();
        for answer in asked {
            let answer = answer.join().expect("the caller runs");
            assert!(
                matches!(
                    answer,
                    Ok(_)
                        | Err(Error::Query {
                            kind: ErrorKind::NotFound,
                            ..
                        })
                ),
                "a call sent on by the follower: {answer:?}"
            );
        }
    });
    // A DBMS given only a follower: its calls are answered by the leader.
    let pairs = cluster.dir().join("forwarded.pairs");
    std::fs::write(&pairs, "900,1\n900,5\n901,5\n").expect("the pairs file is written");
    let pairs = pairs.to_str().expect("a UTF-8 path");
    let run = bitfold(&["import", "--master", follower, "--format", "pairs", pairs]);
    assert!(run.status.success(), "{}", stderr(&run));
    let run = bitfold(&[
        "query",
        "--master",
        follower,
        "--output",
        "count",
        "R:900-901",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(stdout(&run).trim(), "2");
    let run = bitfold(&["delete", "--master", follower, "901"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let run = bitfold(&["query", "--master", follower, "--output", "count", "P:901"]);
    assert_eq!(
        run.status.code(),
        Some(4),
        "{}{}",
        stdout(&run),
        stderr(&run)
    );
    // Its status is the leader's: every master, the leader among them.
    let run = bitfold(&["status", "--master", follower]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    let leaders = text
        .lines()
        .filter(|l| l.starts_with("master ") && l.contains(" leader "))
        .count();
    assert_eq!(leaders, 1, "{text}");
}
