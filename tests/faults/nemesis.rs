//! The nemesis: one fault at a time on the cluster's processes, at times
//! and of kinds drawn from the seed, each undone before the next.
//!
//! With three masters (docs/protocol.md §12) a master fault takes one of
//! them, the leader or a follower: killed (`kill -9`, then started again),
//! stopped (SIGSTOP) for longer than an election takes, or its data
//! directory wiped (it rejoins as a new member and catches up). The next
//! master fault waits until every master is a voting member again, so that
//! a majority is never down at once; a slave fault may come meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bitfold_client::Client;

use super::history::{Action, Outcome, Recorder};
use crate::util::{Cluster, Rng, Server};

/// The master's flags: a hung slave is given up on after 1 s, a down one
/// probed every 200 ms, so a run sees many faults and heals quickly.
pub use crate::util::QUICK_MASTER as MASTER_ARGS;

/// The kinds of fault, for the tally. `stall-then-kill-master` stops a
/// slave (SIGSTOP) so that the master waits on it mid-import, kills the
/// master (SIGKILL), then kills the slave and starts both again;
/// `replace-slave` puts a new machine (an empty data directory, a new
/// address on 127.0.0.1) in a slave's place, rewrites the cluster file to
/// it and runs `rebalance`; `kill-partners` kills a slave and, once it is
/// back, the next one (its partner for the vids they both own), so that
/// writes fail on each owner in turn; `wipe-master` (several masters
/// only) kills a master, deletes its data directory and starts it again.
/// With several masters, `stall-then-kill-master` kills the leader.
pub const KINDS: [&str; 10] = [
    "kill-slave",
    "pause-slave",
    "pause-master",
    "kill-master",
    "wipe-slave",
    "rebalance",
    "stall-then-kill-master",
    "replace-slave",
    "kill-partners",
    "wipe-master",
];

/// Relative weights of [`KINDS`] with one master: wiping and killing
/// slaves find the most. (`wipe-master` is for several masters: one
/// master's lost disk loses what it recorded. Its weight of 0 keeps each
/// seed's schedule as it was before there were several.)
const WEIGHTS: [u64; 10] = [16, 8, 5, 10, 22, 8, 12, 10, 12, 0];

/// Relative weights of [`KINDS`] with several masters: about three faults
/// in five on a master (the slaves' faults are the one-master run's).
const WEIGHTS_REPLICATED: [u64; 10] = [8, 4, 14, 16, 10, 4, 10, 4, 6, 16];

/// How long the masters may take to be whole again (every one a voting
/// member, one leading) after a master fault, before the next one.
const MASTERS_WHOLE: Duration = Duration::from_secs(20);

/// Longer than an election takes (600 to 1200 ms of silence): a stopped
/// master is held at least this long, so that another is elected.
const PAST_ELECTION: u64 = 1500;

/// Applies faults until `stop`; returns how many of each kind of [`KINDS`].
pub fn run(
    cluster: &mut Cluster,
    seed: u64,
    recorder: &Recorder,
    stop: &AtomicBool,
) -> [usize; KINDS.len()] {
    let mut rng = Rng(seed ^ 0x6e65_6d65_7369_7300);
    let mut counts = [0; KINDS.len()];
    let mut client = Client::connect(&cluster.master_addr()).expect("the master accepts a client");
    client.set_timeout(Duration::from_secs(40));
    let slaves = cluster.slave_addrs.len() as u64;
    let replicated = !cluster.masters.is_empty();
    let weights = if replicated {
        WEIGHTS_REPLICATED
    } else {
        WEIGHTS
    };
    while !stop.load(Ordering::Acquire) {
        pause(200 + rng.below(1000), stop);
        if stop.load(Ordering::Acquire) {
            break;
        }
        let mut pick = rng.below(weights.iter().sum());
        let kind = weights
            .iter()
            .position(|&w| {
                let here = pick < w;
                pick = pick.saturating_sub(w);
                here
            })
            .expect("a kind");
        let slave = rng.below(slaves) as usize;
        // kill-partners: the partner dies as soon as the master sees the
        // first slave up again, or a little later, before it is refilled.
        let gap = Duration::from_millis(rng.below(2) * rng.below(300));
        // Half the holds short: a slave back before any read of it.
        let mut hold = if rng.below(2) == 0 {
            Duration::from_millis(rng.below(300))
        } else {
            Duration::from_millis(300 + rng.below(3000))
        };
        // With several masters: which one a master fault takes (the leader
        // two times in three), and a stopped one held past an election.
        let mut master = 0;
        let mut which = String::new();
        if replicated {
            let leader = rng.below(3) < 2 || kind == 6;
            let other = rng.below(cluster.masters.len() as u64 - 1) as usize;
            if matches!(kind, 2 | 3 | 6 | 9) {
                (master, which) = pick_master(cluster, &client, leader, other);
            }
            if kind == 2 {
                hold = Duration::from_millis(PAST_ELECTION + rng.below(2500));
            }
        }
        counts[kind] += 1;
        let what = match kind {
            0 | 1 | 4 | 6 => format!("{} s{slave} for {} ms", KINDS[kind], hold.as_millis()),
            8 => format!(
                "{} s{slave} then, {} ms after the master sees it up, s{}, for {} ms each",
                KINDS[kind],
                gap.as_millis(),
                (slave as u64 + 1) % slaves,
                hold.max(Duration::from_millis(300)).as_millis()
            ),
            7 => format!("{} s{slave}", KINDS[kind]),
            2 | 3 | 9 => format!("{}{which} for {} ms", KINDS[kind], hold.as_millis()),
            _ => KINDS[kind].to_string(),
        };
        let what = match kind {
            6 if replicated => format!("{what} ({which})"),
            _ => what,
        };
        recorder.record("nemesis", Action::Fault(what), || match kind {
            0 => {
                cluster.kill_slave(slave);
                thread::sleep(hold);
                outcome(restart_slave(cluster, slave))
            }
            1 => {
                signal_slave(cluster, slave, libc::SIGSTOP);
                thread::sleep(hold);
                signal_slave(cluster, slave, libc::SIGCONT);
                Outcome::Done
            }
            2 => {
                signal_master(cluster, master, libc::SIGSTOP);
                thread::sleep(hold);
                signal_master(cluster, master, libc::SIGCONT);
                outcome(masters_whole(cluster, &client))
            }
            3 => {
                kill_master(cluster, master);
                thread::sleep(hold);
                outcome(
                    restart_master(cluster, master).and_then(|()| masters_whole(cluster, &client)),
                )
            }
            9 => {
                kill_master(cluster, master);
                let wiped = std::fs::remove_dir_all(cluster.master_dir(master));
                thread::sleep(hold);
                match wiped {
                    Ok(()) => outcome(
                        restart_master(cluster, master)
                            .and_then(|()| masters_whole(cluster, &client)),
                    ),
                    Err(e) => Outcome::Failed(format!("the data directory was not removed: {e}")),
                }
            }
            4 => {
                cluster.kill_slave(slave);
                let wiped = std::fs::remove_dir_all(cluster.slave_dir(slave));
                thread::sleep(hold);
                match wiped {
                    Ok(()) => {
                        let restarted = outcome(restart_slave(cluster, slave));
                        wait_refilled(&client, stop);
                        restarted
                    }
                    Err(e) => Outcome::Failed(format!("the data directory was not removed: {e}")),
                }
            }
            5 => outcome(rebalance(&client)),
            6 => {
                signal_slave(cluster, slave, libc::SIGSTOP);
                thread::sleep(hold.max(Duration::from_millis(200)));
                kill_master(cluster, master);
                cluster.kill_slave(slave);
                outcome(
                    restart_slave(cluster, slave)
                        .and_then(|()| restart_master(cluster, master))
                        .and_then(|()| masters_whole(cluster, &client)),
                )
            }
            8 => {
                let partner = (slave + 1) % cluster.slaves.len();
                let hold = hold.max(Duration::from_millis(300));
                cluster.kill_slave(slave);
                thread::sleep(hold);
                let first = restart_slave(cluster, slave);
                wait_up(&client, slave);
                thread::sleep(gap);
                cluster.kill_slave(partner);
                thread::sleep(hold);
                outcome(first.and(restart_slave(cluster, partner)))
            }
            _ => {
                cluster.replace_slave(slave);
                cluster.write_cluster_file(cluster.slave_addrs.len(), super::REPLICAS);
                let rebalanced = outcome(rebalance(&client));
                wait_refilled(&client, stop);
                rebalanced
            }
        });
    }
    counts
}

/// Waits (at most 20 s) after a slave lost its disk (wiped, or a new
/// machine in its place) until the master says no vector lacks a copy, so
/// that the next fault never takes a vector's last copy: the faults come
/// one at a time, and a lost disk is undone only once it is refilled. With
/// `replicas = 2`, both owners' disks lost before the first is refilled
/// lose what only they held; the master then answers `unavailable` for
/// those vectors (docs/protocol.md §9), and this test could not tell that
/// from a lost write. A refill slower than that is found at healing.
fn wait_refilled(client: &Client, stop: &AtomicBool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && !stop.load(Ordering::Acquire) {
        if client
            .placement()
            .is_ok_and(|p| p.under_replicated == 0 && p.lost == 0)
        {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (at most 3 s) until the master reports slave `i` up.
fn wait_up(client: &Client, i: usize) {
    for _ in 0..150 {
        if client
            .status()
            .is_ok_and(|s| s.get(i).is_some_and(|s| s.up))
        {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn outcome(result: Result<(), String>) -> Outcome {
    match result {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Failed(e),
    }
}

/// Sleeps `ms`, waking early once `stop` is set.
fn pause(ms: u64, stop: &AtomicBool) {
    for _ in 0..ms / 20 {
        if stop.load(Ordering::Acquire) {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn signal_slave(cluster: &Cluster, i: usize, signal: i32) {
    if let Some(slave) = &cluster.slaves[i] {
        slave.signal(signal);
    }
}

/// Sends `signal` to master `i` (with one master, to it).
fn signal_master(cluster: &Cluster, i: usize, signal: i32) {
    let master = match cluster.masters.get(i) {
        Some(master) => master,
        None => &cluster.master,
    };
    if let Some(master) = master {
        master.signal(signal);
    }
}

/// Kills master `i` (with one master, it: kept, for its address).
fn kill_master(cluster: &mut Cluster, i: usize) {
    if cluster.masters.is_empty() {
        if let Some(master) = cluster.master.as_mut() {
            master.kill();
        }
    } else if let Some(mut master) = cluster.masters[i].take() {
        master.kill();
    }
}

/// With several masters, the one a fault takes and how it is described:
/// the leader (as the masters' status names it; when none answers, any)
/// or, unless `leader`, the `other`th of the rest. With one, it.
fn pick_master(cluster: &Cluster, client: &Client, leader: bool, other: usize) -> (usize, String) {
    let count = cluster.masters.len();
    let led = client.full_status().ok().and_then(|s| {
        let name = s.masters.iter().find(|m| m.state == "leader")?.name.clone();
        (0..count).find(|&i| name == format!("m{i}"))
    });
    match led {
        Some(i) if leader => (i, format!(" m{i} (the leader)")),
        Some(i) => {
            let j = (i + 1 + other) % count;
            (j, format!(" m{j} (a follower)"))
        }
        None => (other, format!(" m{other} (no leader known)")),
    }
}

/// With several masters, waits (at most [`MASTERS_WHOLE`]) until every
/// one is a voting member again and one leads, so that the next master
/// fault never leaves fewer than a majority: a master back from a fault
/// (a wiped one joining as a new member above all) may not count yet.
/// With one master, returns at once.
fn masters_whole(cluster: &Cluster, client: &Client) -> Result<(), String> {
    cluster.masters_voting(client, MASTERS_WHOLE)
}

/// Starts slave `i` again at its address with what is left of its data,
/// trying a few times.
pub fn restart_slave(cluster: &mut Cluster, i: usize) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..5 {
        match cluster.restart_slave(i) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(300));
    }
    Err(format!("s{i} did not start again: {last}"))
}

/// Kills master `i` (with one master, it) if it runs and starts it again
/// at its address with its data directory (whatever is left of it) and
/// [`MASTER_ARGS`], trying a few times.
pub fn restart_master(cluster: &mut Cluster, i: usize) -> Result<(), String> {
    if cluster.masters.is_empty() {
        return restart_the_master(cluster);
    }
    kill_master(cluster, i);
    let mut last = String::new();
    for _ in 0..5 {
        match cluster.spawn_master(i) {
            Ok(server) => {
                cluster.masters[i] = Some(server);
                return Ok(());
            }
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(300));
    }
    Err(format!("master m{i} did not start again: {last}"))
}

/// The one master: killed if it runs and started again at its address.
fn restart_the_master(cluster: &mut Cluster) -> Result<(), String> {
    let addr = cluster
        .master
        .as_ref()
        .expect("a master was started")
        .addr
        .clone();
    let mut args: Vec<String> = vec![
        "master".into(),
        "--listen".into(),
        addr,
        "--cluster".into(),
        cluster.dir().join("cluster.toml").display().to_string(),
        "--data-dir".into(),
        cluster.dir().join("master-data").display().to_string(),
    ];
    args.extend(MASTER_ARGS.iter().map(|s| s.to_string()));
    if let Some(master) = cluster.master.as_mut() {
        master.kill();
    }
    let mut last = String::new();
    for _ in 0..5 {
        match Server::start("master", &args) {
            Ok(server) => {
                cluster.master = Some(server);
                return Ok(());
            }
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(300));
    }
    Err(format!("the master did not start again: {last}"))
}

/// Runs `rebalance` steps until the move is finished (at most 20 steps).
pub fn rebalance(client: &Client) -> Result<(), String> {
    for _ in 0..20 {
        match client.rebalance(2048) {
            Ok(p) if p.finished => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("rebalance: {e}")),
        }
    }
    Err("rebalance did not finish in 20 steps".into())
}

/// Undoes every fault: each slave and the master running, none stopped.
pub fn heal(cluster: &mut Cluster) -> Result<(), String> {
    for i in 0..cluster.slaves.len() {
        match &cluster.slaves[i] {
            Some(slave) => slave.signal(libc::SIGCONT),
            None => restart_slave(cluster, i)?,
        }
    }
    let alive = |m: &Option<Server>| {
        m.as_ref().is_some_and(|m| {
            // SAFETY: kill(2) with signal 0 only checks that the pid exists.
            unsafe { libc::kill(m.pid() as i32, 0) == 0 }
        })
    };
    if cluster.masters.is_empty() {
        signal_master(cluster, 0, libc::SIGCONT);
        if !alive(&cluster.master) {
            restart_master(cluster, 0)?;
        }
    }
    for i in 0..cluster.masters.len() {
        signal_master(cluster, i, libc::SIGCONT);
        if !alive(&cluster.masters[i]) {
            restart_master(cluster, i)?;
        }
    }
    Ok(())
}

/// With several masters, waits until every one votes and one leads
/// ([`masters_whole`]), for healing.
pub fn wait_masters_whole(cluster: &Cluster, client: &Client) -> Result<(), String> {
    masters_whole(cluster, client)
}
