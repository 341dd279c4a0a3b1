//! Failures against real process deaths: every answer exact, or the error
//! the scenario allows; never a wrong answer. Each scenario prints a line of
//! its tally (run with `--nocapture` to see them).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bitfold_client::{Answer, Client, Error, ErrorKind, Format};
use bitfold_server::placement;

use crate::util::{Cluster, Oracle, Rng, stderr};

/// Master flags that keep the scenarios short: a hung slave is given up on after 1 s.
const QUICK: &[&str] = &[
    "--rpc-timeout",
    "1s",
    "--query-timeout",
    "10s",
    "--attempts",
    "4",
];
/// `args` and `--plan plan`: every scenario runs under both ways of
/// gathering the term vectors (see the end of this file).
fn with_plan<'a>(args: &[&'a str], plan: &'a str) -> Vec<&'a str> {
    [args, &["--plan", plan]].concat()
}

/// The most any query may take with [`QUICK`]: its query timeout plus slack for a busy machine.
const BOUND: Duration = Duration::from_secs(20);

/// What a stream of queries saw.
#[derive(Debug, Default)]
struct Tally {
    run: usize,
    exact: usize,
    errors: Vec<String>,
    wrong: Vec<String>,
    longest: Duration,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.run += other.run;
        self.exact += other.exact;
        self.errors.extend(other.errors);
        self.wrong.extend(other.wrong);
        self.longest = self.longest.max(other.longest);
    }

    fn print(&self, scenario: &str) {
        println!(
            "scenario | {scenario} | run {} | exact {} | errors {} | wrong {} | longest {:.2}s",
            self.run,
            self.exact,
            self.errors.len(),
            self.wrong.len(),
            self.longest.as_secs_f64()
        );
    }

    fn assert_all_exact(&self, scenario: &str) {
        self.print(scenario);
        assert!(
            self.wrong.is_empty(),
            "{scenario}: wrong answers: {:?}",
            self.wrong
        );
        assert!(
            self.errors.is_empty(),
            "{scenario}: errors: {:?}",
            self.errors
        );
        assert!(
            self.longest < BOUND,
            "{scenario}: a query took {:?}",
            self.longest
        );
    }
}

/// A data set and the queries to ask of it, with their answers.
struct Workload {
    oracle: Oracle,
    queries: Vec<(String, BTreeSet<u32>)>,
}

impl Workload {
    /// 48 vectors at vids 0..48.
    fn new(seed: u64) -> Workload {
        Workload::over(seed, &(0..48).collect::<Vec<_>>())
    }

    /// A vector at each of the 48 ascending `vids`; the queries' terms name
    /// them by position, so every term holds vectors.
    fn over(seed: u64, vids: &[u64]) -> Workload {
        assert_eq!(vids.len(), 48, "the queries below address 48 vectors");
        let mut rng = Rng(seed);
        let mut oracle = Oracle::default();
        for &vid in vids {
            let count = 2000 + rng.below(20_000);
            oracle.add(vid, (0..count).map(|_| rng.below(1 << 20) as u32));
        }
        let v = |i: u64| vids[i as usize];
        let mut queries = Vec::new();
        for i in 0..24u64 {
            let terms = match i % 4 {
                0 => vec![(v(i), v(i))],
                1 => vec![(v(0), v(47))],
                2 => vec![(v(i % 40), v(i % 40 + 8)), (0, u64::MAX)],
                _ => vec![(v(0), v(20)), (v(10), v(30)), (v(5 + i % 7), v(45))],
            };
            queries.push((Oracle::range_query(&terms), oracle.range(&terms)));
        }
        Workload { oracle, queries }
    }

    fn import(&self, cluster: &Cluster) {
        let file = cluster.dir().join("workload.csv");
        self.oracle.write_pairs(&file);
        let run = cluster.cli(&["import", file.to_str().unwrap()]);
        assert!(run.status.success(), "import failed: {}", stderr(&run));
    }

    /// Asks every query once (count and roaring forms alternate).
    fn ask_all(&self, client: &Client) -> Tally {
        let mut tally = Tally::default();
        for (i, (query, expected)) in self.queries.iter().enumerate() {
            let form = if i % 2 == 0 {
                Format::Count
            } else {
                Format::Roaring
            };
            let started = Instant::now();
            let answer = client.query(query, form);
            tally.longest = tally.longest.max(started.elapsed());
            tally.run += 1;
            match answer {
                Ok(answer) if matches(&answer, expected) => tally.exact += 1,
                Ok(answer) => tally.wrong.push(format!("{query}: {}", describe(&answer))),
                Err(err) => tally.errors.push(format!("{query}: {err}")),
            }
        }
        tally
    }

    /// `threads` clients asking every query at least `rounds` times, and
    /// until `meanwhile` has returned, so the clients are still asking when
    /// whatever `meanwhile` does happens.
    fn stream(&self, addr: &str, threads: usize, rounds: usize, meanwhile: impl FnOnce()) -> Tally {
        let total = Mutex::new(Tally::default());
        let done = AtomicBool::new(false);
        thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    let client = Client::connect(addr).expect("the master accepts a client");
                    let mut round = 0;
                    while round < rounds || !done.load(Ordering::Acquire) {
                        let tally = self.ask_all(&client);
                        total.lock().unwrap().merge(tally);
                        round += 1;
                    }
                });
            }
            meanwhile();
            done.store(true, Ordering::Release);
        });
        total.into_inner().unwrap()
    }
}

fn matches(answer: &Answer, expected: &BTreeSet<u32>) -> bool {
    match answer {
        Answer::Count(n) => *n == expected.len() as u64,
        Answer::Roaring(bytes) => roaring::RoaringBitmap::deserialize_from(&bytes[..])
            .is_ok_and(|b| b.iter().eq(expected.iter().copied())),
        Answer::Words(bytes) => &crate::util::words_to_bits(bytes) == expected,
    }
}

fn describe(answer: &Answer) -> String {
    match answer {
        Answer::Count(n) => format!("count {n}"),
        Answer::Roaring(bytes) => format!("{} roaring bytes", bytes.len()),
        Answer::Words(bytes) => format!("{} word bytes", bytes.len()),
    }
}

fn a_slave_killed_before_and_during_a_stream_changes_no_answer(plan: &str, layout: &str) {
    let workload = Workload::new(11);
    {
        let mut cluster = Cluster::start_laid_out(4, 2, &with_plan(QUICK, plan), layout);
        workload.import(&cluster);
        cluster.kill_slave(0);
        let tally = workload.stream(&cluster.master_addr(), 1, 2, || {});
        tally.assert_all_exact("replicas 2, s0 killed before");
    }
    let mut cluster = Cluster::start_laid_out(4, 2, &with_plan(QUICK, plan), layout);
    workload.import(&cluster);
    let addr = cluster.master_addr();
    let tally = workload.stream(&addr, 2, 6, || {
        thread::sleep(Duration::from_millis(300));
        cluster.kill_slave(2);
    });
    tally.assert_all_exact("replicas 2, s2 killed during (2 clients)");
    // The master probes only slaves it already holds down, so s2 is marked
    // down only when a query's call to it fails: proof that queries were in
    // flight when it died.
    let s2_down = |log: &str| {
        log.lines()
            .any(|line| line.contains("slave s2 (") && line.contains("is down"))
    };
    let log = cluster.master.as_ref().unwrap().log_once(s2_down);
    assert!(
        s2_down(&log),
        "no query saw s2 fail, so the scenario did not happen: {log}"
    );
}

fn a_hung_slave_is_given_up_on_in_time_and_used_again_after(plan: &str, layout: &str) {
    let mut cluster = Cluster::start_laid_out(4, 2, &with_plan(QUICK, plan), layout);
    let workload = Workload::new(12);
    workload.import(&cluster);
    let hung = 1;
    cluster.slaves[hung].as_ref().unwrap().signal(libc::SIGSTOP);
    let tally = workload.stream(&cluster.master_addr(), 2, 2, || {});
    tally.assert_all_exact("replicas 2, s1 stopped (SIGSTOP)");

    cluster.slaves[hung].as_ref().unwrap().signal(libc::SIGCONT);
    wait_until_up(&cluster, hung);
    // Kill every other owner of some vids: only the revived slave can answer for them.
    let partner = (hung + 1) % 4;
    cluster.kill_slave(partner);
    workload
        .stream(&cluster.master_addr(), 1, 1, || {})
        .assert_all_exact("s1 continued, s2 killed");
}

/// docs/protocol.md §4: with default settings every query is answered or failed within
/// 30 s, even while a slave hangs with its connections open.
fn with_default_settings_a_hung_slave_costs_less_than_30_seconds(plan: &str) {
    let cluster = Cluster::start_with(4, 2, &with_plan(&[], plan));
    let workload = Workload::new(18);
    workload.import(&cluster);
    cluster.slaves[3].as_ref().unwrap().signal(libc::SIGSTOP);
    let tally = workload.stream(&cluster.master_addr(), 2, 1, || {});
    tally.print("replicas 2, s3 stopped (SIGSTOP), default timeouts");
    assert!(
        tally.wrong.is_empty() && tally.errors.is_empty(),
        "{tally:?}"
    );
    assert!(
        tally.longest < Duration::from_secs(30),
        "a query took {:?}",
        tally.longest
    );
}

fn wait_until_up(cluster: &Cluster, slave: usize) {
    let client = cluster.client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = client.status().expect("the master answers status");
        if status[slave].up {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "s{slave} never came back up: {status:?}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

fn a_coordinator_killed_mid_query_does_not_change_the_answer(plan: &str) {
    // Every vector's first owner is s0, so with `bandwidth` s0 coordinates
    // every query (it holds all of each query's data): two clients keep it
    // busy, and it is SIGKILLed with queries in flight.
    let victim = 0;
    let mut cluster = Cluster::start_with(
        4,
        2,
        &with_plan(&[QUICK, &["--policy", "bandwidth"]].concat(), plan),
    );
    let vids: Vec<u64> = (0..)
        .filter(|&v| placement::owners(v, 4, 2)[0] == victim)
        .take(48)
        .collect();
    let workload = Workload::over(17, &vids);
    workload.import(&cluster);
    let addr = cluster.master_addr();
    let tally = workload.stream(&addr, 2, 6, || {
        thread::sleep(Duration::from_millis(300));
        cluster.kill_slave(victim);
    });
    tally.assert_all_exact("the coordinator (s0) killed mid-stream, bandwidth policy");
    let retried = |log: &str| {
        log.contains("coordinator s0 (") && log.contains("the query is tried again elsewhere")
    };
    let log = cluster.master.as_ref().unwrap().log_once(retried);
    assert!(
        retried(&log),
        "the master never saw its coordinator fail, so the scenario did not happen: {log}"
    );
}

fn with_one_copy_a_dead_slave_makes_its_vectors_unavailable_until_it_returns(plan: &str) {
    let mut cluster = Cluster::start_with(4, 1, &with_plan(QUICK, plan));
    let workload = Workload::new(14);
    workload.import(&cluster);
    let dead = 2;
    cluster.kill_slave(dead);
    let client = cluster.client();
    let mut tally = Tally::default();
    for (&vid, bits) in &workload.oracle.vectors {
        let started = Instant::now();
        let answer = client.query(&format!("P:{vid}"), Format::Count);
        tally.longest = tally.longest.max(started.elapsed());
        tally.run += 1;
        if placement::owners(vid, 4, 1).contains(&dead) {
            match answer {
                Err(Error::Query {
                    kind: ErrorKind::Unavailable,
                    failed_machines,
                    message,
                }) => {
                    assert!(
                        failed_machines.iter().any(|m| m.contains("s2")),
                        "{failed_machines:?}"
                    );
                    assert!(message.contains("s2"), "{message}");
                    assert!(
                        !message.contains("--rpc-timeout"),
                        "a dead slave is not a slow one: {message}"
                    );
                    tally.errors.push(message);
                }
                other => panic!("P:{vid} lives only on the dead s2, got {other:?}"),
            }
        } else {
            assert!(
                matches!(answer, Ok(Answer::Count(n)) if n == bits.len() as u64),
                "P:{vid}"
            );
            tally.exact += 1;
        }
    }
    // A range over every vector needs s2: unavailable, never a partial answer.
    match client.query("R:0-47", Format::Count) {
        Err(Error::Query {
            kind: ErrorKind::Unavailable,
            ..
        }) => tally.errors.push("R:0-47".into()),
        other => panic!("R:0-47 needs s2, got {other:?}"),
    }
    tally.run += 1;
    tally.print("replicas 1, s2 killed (errors are the expected unavailable)");
    assert!(tally.wrong.is_empty());

    cluster.restart_slave(dead).expect("the slave restarts");
    wait_until_up(&cluster, dead);
    workload
        .stream(&cluster.master_addr(), 1, 1, || {})
        .assert_all_exact("replicas 1, s2 restarted");
}

/// A slave given up on for answering too slowly may be up and busy (a
/// query over vectors of billions of bits takes seconds): the error names
/// the flag that gives it longer.
fn with_one_copy_a_hung_slave_fails_its_queries_naming_the_timeout_to_raise(plan: &str) {
    let cluster = Cluster::start_with(4, 1, &with_plan(QUICK, plan));
    let workload = Workload::new(19);
    workload.import(&cluster);
    let hung = 2;
    cluster.slaves[hung].as_ref().unwrap().signal(libc::SIGSTOP);
    let client = cluster.client();
    let on_hung = *workload
        .oracle
        .vectors
        .keys()
        .find(|&&vid| placement::owners(vid, 4, 1) == [hung])
        .expect("some vector lives on s2 alone");
    // The range meets the hung slave first; the point query then finds it down.
    for query in ["R:0-47".to_owned(), format!("P:{on_hung}")] {
        match client.query(&query, Format::Count) {
            Err(Error::Query {
                kind: ErrorKind::Unavailable,
                failed_machines,
                message,
            }) => {
                assert_eq!(failed_machines, ["s2"], "{query}: {message}");
                assert!(
                    message.contains("is down: no answer within")
                        && message.contains("raise the master's --rpc-timeout, now 1.0 s"),
                    "{query}: {message}"
                );
            }
            other => panic!("{query} needs the hung s2, got {other:?}"),
        }
    }
    cluster.slaves[hung].as_ref().unwrap().signal(libc::SIGCONT);
    wait_until_up(&cluster, hung);
    workload
        .stream(&cluster.master_addr(), 1, 1, || {})
        .assert_all_exact("replicas 1, s2 continued");
}

fn a_restarted_master_knows_every_vector_even_with_a_slave_down(plan: &str, layout: &str) {
    let mut cluster = Cluster::start_laid_out(4, 2, &with_plan(QUICK, plan), layout);
    let workload = Workload::new(15);
    workload.import(&cluster);
    cluster.restart_master();
    workload
        .stream(&cluster.master_addr(), 1, 1, || {})
        .assert_all_exact("master restarted");
    cluster.kill_slave(0);
    cluster.restart_master();
    workload
        .stream(&cluster.master_addr(), 1, 1, || {})
        .assert_all_exact("master restarted, s0 down");
}

fn acknowledged_imports_survive_sigkill_and_corrupt_files_are_refused(plan: &str, layout: &str) {
    let mut cluster = Cluster::start_laid_out(4, 2, &with_plan(QUICK, plan), layout);
    let workload = Workload::new(16);
    workload.import(&cluster);
    for slave in 0..4 {
        cluster.kill_slave(slave);
    }
    for slave in 0..4 {
        cluster
            .restart_slave(slave)
            .expect("the slave restarts with its data");
    }
    for slave in 0..4 {
        wait_until_up(&cluster, slave);
    }
    workload
        .stream(&cluster.master_addr(), 1, 1, || {})
        .assert_all_exact("every slave SIGKILLed and restarted");

    // Flip a byte in the middle of s1's biggest data file.
    let victim = 1;
    cluster.kill_slave(victim);
    let file = biggest_file(&cluster.slave_dir(victim));
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    match cluster.restart_slave(victim) {
        Err(message) => assert!(
            message.contains(&name),
            "the refusal should name {name}: {message}"
        ),
        Ok(()) => panic!("a slave started on a corrupt {name}"),
    }
    workload
        .stream(&cluster.master_addr(), 1, 1, || {})
        .assert_all_exact("s1 refuses a corrupt file (replicas 2)");
}

fn biggest_file(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().unwrap().len())
        .expect("the slave has data files")
}

/// Runs each scenario once per plan: the design document's chains, and the
/// fan-out the master picks by default, placed vid by vid with vectors
/// whole; and those that hold under any placement (`any`) twice more, with
/// the default plan, their vectors cut into 16 pieces of 2^16 bits placed
/// vid by vid and with piece `p` of every vector together (util::LAYOUTS).
macro_rules! under_every_plan {
    (whole: [$($whole:ident),* $(,)?], any: [$($any:ident),* $(,)?] $(,)?) => {
        mod chain {
            $(#[test]
            fn $whole() {
                super::$whole("chain")
            })*
            $(#[test]
            fn $any() {
                super::$any("chain", crate::util::LAYOUTS[0].1)
            })*
        }
        mod fan_out {
            $(#[test]
            fn $whole() {
                super::$whole("fan-out")
            })*
            $(#[test]
            fn $any() {
                super::$any("fan-out", crate::util::LAYOUTS[0].1)
            })*
        }
        mod pieces_by_vid {
            $(#[test]
            fn $any() {
                super::$any("fan-out", crate::util::LAYOUTS[1].1)
            })*
        }
        mod pieces_together {
            $(#[test]
            fn $any() {
                super::$any("fan-out", crate::util::LAYOUTS[2].1)
            })*
        }
    };
}

under_every_plan!(
    whole: [
        with_default_settings_a_hung_slave_costs_less_than_30_seconds,
        a_coordinator_killed_mid_query_does_not_change_the_answer,
        with_one_copy_a_dead_slave_makes_its_vectors_unavailable_until_it_returns,
        with_one_copy_a_hung_slave_fails_its_queries_naming_the_timeout_to_raise,
    ],
    any: [
        a_slave_killed_before_and_during_a_stream_changes_no_answer,
        a_hung_slave_is_given_up_on_in_time_and_used_again_after,
        a_restarted_master_knows_every_vector_even_with_a_slave_down,
        acknowledged_imports_survive_sigkill_and_corrupt_files_are_refused,
    ],
);
