//! `kill -9` in the middle of imports or updates loses no acknowledged batch.
//!
//! Each test spawns its own binary as a writer process (selected by an
//! environment variable) that imports (or updates) numbered batches and
//! prints each number once `import` (`update`) has returned `Ok`. The parent
//! kills it with SIGKILL at a random moment (during a write, a merge, or
//! opening), reopens the store and checks that every acknowledged batch is
//! there, whole, that batches are never half applied, and that the range
//! aggregates are exact.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, SystemTime};

use bitfold_engine::store::Update;
use bitfold_engine::{Snapshot, Store, VectorBuf, VectorPart};

mod common;
use common::Rng;

const WRITER_DIR: &str = "BITFOLD_CRASH_WRITER_DIR";
const FIRST_BATCH: &str = "BITFOLD_CRASH_FIRST_BATCH";
const SEED: &str = "BITFOLD_CRASH_SEED";

/// Batches each round's writer numbers from `round × ROUND`; the rounds.
const ROUND: u64 = 1000;
const ROUNDS: u64 = 10;

/// Each batch has its own marker vector, so its presence is visible.
const MARKER: u64 = 1 << 40;
/// A vector every batch adds a dense container to.
const DENSE: u64 = 77;

/// The vectors of batch `n`: its marker, 20 bits of its own in a vector it
/// shares with other batches, and a dense container in another shared one.
fn batch(n: u64) -> Vec<(u64, VectorBuf)> {
    let own = (n as u32) * 64;
    let key = (n % 64) as u32;
    vec![
        (MARKER + n, VectorBuf::from_bits(vec![n as u32])),
        (n % 5, VectorBuf::from_bits((own..own + 20).collect())),
        (
            DENSE,
            VectorBuf::from_bits((key << 16..(key << 16) + 1000).collect()),
        ),
    ]
}

/// Whether batch `n` is in the snapshot; panics if it is there in part.
fn applied(snapshot: &Snapshot, n: u64) -> bool {
    let has = |vid: u64, bit: u32| snapshot.parts(vid).any(|p| p.contains(bit));
    let marker = snapshot.contains(MARKER + n);
    for (vid, vector) in batch(n).into_iter().skip(1) {
        for bit in vector.as_part().bits() {
            // The dense container is shared with other batches: it proves
            // nothing when the batch is absent.
            if vid != DENSE || marker {
                assert_eq!(has(vid, bit), marker, "batch {n} is half applied");
            }
        }
    }
    marker
}

/// Whether the range aggregates the store reopened with are exact: covering
/// `vids` gives the union of their vectors.
fn assert_cover_exact(snapshot: &Snapshot, vids: &[u64]) {
    let bits = |parts: &mut dyn Iterator<Item = VectorPart<'_>>| -> BTreeSet<u32> {
        parts.flat_map(|p| p.bits()).collect()
    };
    let naive = bits(&mut vids.iter().flat_map(|&v| snapshot.parts(v)));
    assert_eq!(bits(&mut snapshot.cover(vids).parts.into_iter()), naive);
}

/// The writer process: imports batches from `first` on until killed.
fn write_until_killed(dir: &Path, first: u64) {
    let store = Store::open(dir).unwrap();
    for n in first.. {
        let vectors = batch(n);
        let parts: Vec<(u64, VectorPart<'_>)> =
            vectors.iter().map(|(vid, v)| (*vid, v.as_part())).collect();
        store.import(&parts).unwrap();
        println!("acked {n}");
    }
}

/// Kills the writer if the test fails before it does.
struct Writer(Child);

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts test `test` of this binary as a writer from batch `first` on.
fn spawn_writer(test: &str, dir: &Path, first: u64) -> (Writer, mpsc::Receiver<u64>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(WRITER_DIR, dir)
        .env(FIRST_BATCH, first.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (acks, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // The harness may print "test ... " on the line before the first.
            if let Some((_, n)) = line.split_once("acked ") {
                let _ = acks.send(n.parse().unwrap());
            }
        }
    });
    (Writer(child), received)
}

/// The writer's batch number to start from, when this process is a
/// writer; `None` in the parent.
fn writer_role() -> Option<(std::ffi::OsString, u64)> {
    let dir = std::env::var_os(WRITER_DIR)?;
    Some((dir, std::env::var(FIRST_BATCH).unwrap().parse().unwrap()))
}

/// Held by each test while it runs its rounds. A store's lock belongs to
/// its open file, and a child spawned by another test's thread holds a copy
/// of every open file until it execs: a writer spawned then could find the
/// store of a check in the other test still locked. One test at a time
/// keeps every lock this binary takes to the process that took it.
static ONE_TEST_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs [`ROUNDS`] rounds in `dir`: start a writer (test `test` of this
/// binary) from batch `round × ROUND`, let it acknowledge a random number
/// of batches, kill it at a random moment, reopen the store and hand
/// `check` the snapshot, every batch acknowledged so far, and the round's
/// first batch.
fn kill_rounds(test: &str, dir: &Path, mut check: impl FnMut(&Snapshot, &[u64], u64)) {
    // Kill points differ from run to run; a failing run prints its seed,
    // and setting it in the environment replays the same kill points.
    let seed = match std::env::var(SEED) {
        Ok(seed) => seed.parse().unwrap(),
        Err(_) => SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    eprintln!("{SEED}={seed}");
    let _alone = ONE_TEST_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = Rng(seed);
    let mut acked = Vec::new();
    for round in 0..ROUNDS {
        let first = round * ROUND;
        let (mut writer, acks) = spawn_writer(test, dir, first);
        for _ in 0..rng.below(13) {
            let n = acks
                .recv_timeout(Duration::from_secs(60))
                .expect("the writer acknowledges batches");
            acked.push(n);
        }
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        writer.0.kill().unwrap();
        writer.0.wait().unwrap();
        // Acknowledgements printed before the kill count too.
        acked.extend(acks.iter());
        let store = Store::open(dir).unwrap();
        check(&store.snapshot(), &acked, first);
    }
}

#[test]
fn kill_9_loses_no_acknowledged_batch() {
    const TEST: &str = "kill_9_loses_no_acknowledged_batch";
    if let Some((dir, first)) = writer_role() {
        write_until_killed(Path::new(&dir), first);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut landed = 0;
    let mut round = 0;
    kill_rounds(TEST, dir.path(), |snapshot, acked, first| {
        for &n in acked {
            assert!(applied(snapshot, n), "acknowledged batch {n} was lost");
        }
        // Of the batches not acknowledged, only the one in flight may have landed.
        let in_flight = acked.last().map_or(first, |&n| (n + 1).max(first));
        for n in first..first + ROUND {
            if !acked.contains(&n) && applied(snapshot, n) {
                assert_eq!(n, in_flight, "batch {n} landed but was never written");
                landed += 1;
            }
        }
        let all: Vec<u64> = snapshot.vids().collect();
        assert_cover_exact(snapshot, &all);
        assert_cover_exact(snapshot, &all[all.partition_point(|&v| v < MARKER)..]);
        assert_eq!(
            snapshot.vids().filter(|&v| v >= MARKER).count(),
            acked.len() + landed,
            "round {round}"
        );
        round += 1;
    });
    eprintln!("acknowledged batches kept through {ROUNDS} kills; {landed} in flight landed whole");
}

/// The vector update batches clear one bit each from.
const CLEARED: u64 = 5;
/// Update batch `n` deletes vector `DELETED + n`.
const DELETED: u64 = 1 << 30;
/// The vector every update batch replaces with its own bit.
const LATEST: u64 = 9;

/// Update batch `n`: its marker (a replace), for even `n` a clear of bit
/// `n` in a vector those batches clear from, the delete of a vector of its
/// own, and the replace of a vector all batches replace. Odd batches hold
/// only deletes and replaces, which the store writes without rebuilding
/// aggregates, so both ways of writing an update are killed midway.
fn update_batch(n: u64, bit: &VectorBuf) -> Vec<Update<'_>> {
    let mut batch = vec![Update::Replace(MARKER + n, bit.as_part())];
    if n.is_multiple_of(2) {
        batch.push(Update::Clear(CLEARED, bit.as_part()));
    }
    batch.push(Update::Delete(DELETED + n));
    batch.push(Update::Replace(LATEST, bit.as_part()));
    batch
}

/// The writer process: applies update batches from `first` on until killed.
fn update_until_killed(dir: &Path, first: u64) {
    let store = Store::open(dir).unwrap();
    for n in first.. {
        let bit = VectorBuf::from_bits(vec![n as u32]);
        store.update(&update_batch(n, &bit)).unwrap();
        println!("acked {n}");
    }
}

/// Whether update batch `n` is in the snapshot; panics if it is there in part.
fn updated(snapshot: &Snapshot, n: u64) -> bool {
    let marker = snapshot.contains(MARKER + n);
    // Odd batches clear nothing: only the marker and the delete tell.
    let cleared = if n.is_multiple_of(2) {
        !snapshot.parts(CLEARED).any(|p| p.contains(n as u32))
    } else {
        marker
    };
    let deleted = !snapshot.contains(DELETED + n);
    assert_eq!(
        (cleared, deleted),
        (marker, marker),
        "update {n} is half applied"
    );
    marker
}

#[test]
fn kill_9_leaves_each_update_before_or_after() {
    const TEST: &str = "kill_9_leaves_each_update_before_or_after";
    if let Some((dir, first)) = writer_role() {
        update_until_killed(Path::new(&dir), first);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let every: Vec<u64> = (0..ROUNDS * ROUND).collect();
    let cleared = VectorBuf::from_bits(every.iter().map(|&n| n as u32).collect());
    let one = VectorBuf::from_bits(vec![1]);
    let mut batch = vec![(CLEARED, cleared.as_part())];
    batch.extend(every.iter().map(|n| (DELETED + n, one.as_part())));
    Store::open(dir.path()).unwrap().import(&batch).unwrap();
    // The batches found applied in earlier rounds, and the newest of them.
    let mut done = BTreeSet::new();
    kill_rounds(TEST, dir.path(), |snapshot, acked, first| {
        for &n in acked {
            assert!(updated(snapshot, n), "acknowledged update {n} was lost");
        }
        // Batches apply in order: this round's are a prefix of its numbers,
        // ending at most at the one in flight.
        let in_flight = acked.last().map_or(first, |&n| (n + 1).max(first));
        let round: Vec<u64> = (first..first + ROUND)
            .filter(|&n| updated(snapshot, n))
            .collect();
        assert!(round.iter().copied().eq(first..first + round.len() as u64));
        assert!(
            round.last().is_none_or(|&n| n <= in_flight),
            "an update landed unwritten"
        );
        for &n in &every {
            if !(first..first + ROUND).contains(&n) {
                assert_eq!(updated(snapshot, n), done.contains(&n), "update {n}");
            }
        }
        done.extend(round);
        let latest: BTreeSet<u32> = snapshot.parts(LATEST).flat_map(|p| p.bits()).collect();
        let expected = done.last().map(|&n| n as u32);
        assert_eq!(
            latest,
            expected.into_iter().collect(),
            "the latest replace wins"
        );
        let all: Vec<u64> = snapshot.vids().collect();
        assert_cover_exact(snapshot, &all);
        assert_cover_exact(snapshot, &all[all.partition_point(|&v| v < DELETED)..]);
    });
}
