//! Updates (docs/protocol.md §8) on real processes: clears and deletes
//! against the oracle in every result form, on every replica, through
//! failures of owners and of the master, and under a concurrent query load.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use bitfold_client::{Answer, Client, Error, ErrorKind, Format};

use crate::util::{Cluster, LAYOUTS, Oracle, assert_answer, stderr, stdout, wait_until_all_up};

/// Vectors 0..40 with a few hundred random bits each, below 200,000 (four
/// pieces where a layout cuts vectors into pieces of 2^16), imported.
fn loaded(cluster: &Cluster, seed: u64) -> Oracle {
    Oracle::load(cluster, seed, 40, 300, 200_000)
}

/// Writes `changes` as a pairs file to clear, clearing them in the oracle too.
fn clear_file(cluster: &Cluster, oracle: &mut Oracle, changes: &[(u64, Vec<u32>)]) -> String {
    let mut text = String::new();
    for (vid, bits) in changes {
        for bit in bits {
            text.push_str(&format!("{vid},{bit}\n"));
        }
        oracle.clear(*vid, bits);
    }
    let path = cluster.dir().join("clear.pairs");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Every point query (including the deleted vids: not found) and a few
/// ranges, each in all three forms.
fn assert_matches(client: &Client, oracle: &Oracle) {
    for vid in 0..42u64 {
        let query = format!("P:{vid}");
        match oracle.vectors.get(&vid) {
            Some(bits) => assert_answer(client, &query, bits),
            None => match client.query(&query, Format::Count) {
                Err(Error::Query {
                    kind: ErrorKind::NotFound,
                    ..
                }) => {}
                other => panic!("{query} after a delete: {other:?}"),
            },
        }
    }
    for terms in [
        &[(0, 39)][..],
        &[(0, 19), (10, 29)],
        &[(3, 3), (0, 5)],
        &[(5, 12)],
    ] {
        assert_answer(client, &Oracle::range_query(terms), &oracle.range(terms));
    }
}

/// Clears `bits` of `vids` through `bitfold import --clear`, in the oracle
/// too; checks the count the command prints.
fn clear(cluster: &Cluster, oracle: &mut Oracle, changes: &[(u64, Vec<u32>)]) {
    let changed = changes
        .iter()
        .filter(|(vid, bits)| {
            let held = oracle.vectors.get(vid);
            bits.iter().any(|b| held.is_some_and(|h| h.contains(b)))
        })
        .count();
    let path = clear_file(cluster, oracle, changes);
    let run = cluster.cli(&["import", "--clear", &path]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stdout(&run).starts_with(&format!("cleared bits of {changed} vectors")),
        "{}",
        stdout(&run)
    );
}

/// Some of the bits each of `vids` holds in the oracle, and one it does not.
fn some_bits(oracle: &Oracle, vids: &[u64]) -> Vec<(u64, Vec<u32>)> {
    vids.iter()
        .map(|&vid| {
            let mut bits: Vec<u32> = oracle
                .vectors
                .get(&vid)
                .map_or(Vec::new(), |held| held.iter().copied().step_by(2).collect());
            bits.push(4_000_000 + vid as u32);
            (vid, bits)
        })
        .collect()
}

/// Kills each slave in turn (the others up) and checks every answer: with
/// two replicas, each vector is then served by each of its owners once.
fn assert_every_replica_matches(cluster: &mut Cluster, oracle: &Oracle) {
    for i in 0..cluster.slaves.len() {
        cluster.kill_slave(i);
        assert_matches(&cluster.client(), oracle);
        cluster.restart_slave(i).expect("the slave restarts");
        wait_until_all_up(&cluster.client());
    }
}

#[test]
fn clears_and_deletes_answer_exactly_on_every_replica() {
    for (name, layout) in LAYOUTS {
        eprintln!("layout: {name}");
        clears_and_deletes_under(layout);
    }
}

fn clears_and_deletes_under(layout: &str) {
    let mut cluster = Cluster::start_laid_out(4, 2, &[], layout);
    let mut oracle = loaded(&cluster, 11);
    let client = cluster.client();

    let changes = some_bits(&oracle, &[0, 1, 7, 8, 20, 41]);
    clear(&cluster, &mut oracle, &changes);
    let everything: Vec<u32> = oracle.vectors[&3].iter().copied().collect();
    clear(&cluster, &mut oracle, &[(3, everything)]);
    assert_answer(&client, "P:3", &BTreeSet::new());

    let run = cluster.cli(&["delete", "5", "10-12", "30-1000"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let deleted = oracle.delete(5, 5) + oracle.delete(10, 12) + oracle.delete(30, 1000);
    assert_eq!(stdout(&run), format!("deleted {deleted} vectors\n"));
    let again = cluster.cli(&["delete", "5", "10-12"]);
    assert_eq!(stdout(&again), "deleted 0 vectors\n", "{}", stderr(&again));
    assert_matches(&client, &oracle);

    // A deleted vid comes back holding only the new bits.
    client
        .import(&[(
            11,
            bitfold_engine::VectorBuf::from_bits(vec![9, 99]).as_part(),
        )])
        .unwrap();
    oracle.add(11, [9, 99]);
    assert_matches(&client, &oracle);

    let bad = cluster.cli(&["delete", "9-3"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert_every_replica_matches(&mut cluster, &oracle);

    // Everything is durable: a master killed and restarted answers the same.
    cluster.restart_master();
    wait_until_all_up(&cluster.client());
    assert_matches(&cluster.client(), &oracle);
}

#[test]
fn an_owner_that_misses_an_update_catches_up_before_it_serves_again() {
    let mut cluster = Cluster::start(4, 2);
    let mut oracle = loaded(&cluster, 12);
    let before = oracle.clone();
    // The master believes s1 is up until a call to it fails.
    cluster.kill_slave(1);
    let changes = some_bits(&oracle, &(0..16).collect::<Vec<_>>());
    let path = clear_file(&cluster, &mut oracle, &changes);
    let run = cluster.cli(&["import", "--clear", &path]);
    assert_eq!(run.status.code(), Some(5), "{}", stdout(&run));
    assert!(
        stderr(&run).contains("the write is recorded but not yet complete"),
        "{}",
        stderr(&run)
    );
    assert_ne!(before.vectors, oracle.vectors);
    // Its partners serve the cleared vectors meanwhile.
    assert_matches(&cluster.client(), &oracle);
    // A delete while s1 is known to be down is refused whole.
    let refused = cluster.cli(&["delete", "0-39"]);
    assert_eq!(refused.status.code(), Some(5), "{}", stdout(&refused));
    assert!(
        stderr(&refused).contains("nothing was changed"),
        "{}",
        stderr(&refused)
    );
    assert_matches(&cluster.client(), &oracle);

    cluster.restart_slave(1).expect("s1 restarts");
    wait_until_all_up(&cluster.client());
    assert_every_replica_matches(&mut cluster, &oracle);
}

#[test]
fn a_master_killed_during_an_update_leaves_it_whole_or_not_at_all() {
    let mut cluster = Cluster::start(4, 2);
    let mut oracle = loaded(&cluster, 13);
    let before = oracle.clone();
    let changes = some_bits(&oracle, &(0..40).collect::<Vec<_>>());
    let path = clear_file(&cluster, &mut oracle, &changes);
    let args = [
        "import".to_string(),
        "--master".into(),
        cluster.master_addr(),
        "--clear".into(),
        path,
    ];
    let running = thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::util::bitfold(&args)
    });
    // Wherever the kill lands (before the update is recorded, after it,
    // or after it is acknowledged), the outcome is all or nothing.
    thread::sleep(std::time::Duration::from_millis(30));
    cluster.restart_master();
    let run = running.join().unwrap();
    wait_until_all_up(&cluster.client());
    let client = cluster.client();
    let after = match client.query("P:0", Format::Count) {
        Ok(Answer::Count(n)) if n == oracle.vectors[&0].len() as u64 => &oracle,
        Ok(Answer::Count(n)) if n == before.vectors[&0].len() as u64 => &before,
        other => panic!("P:0 is neither before nor after: {other:?}"),
    };
    if run.status.success() {
        assert!(
            std::ptr::eq(after, &oracle),
            "an acknowledged clear was lost"
        );
    }
    assert_matches(&client, after);
    assert_every_replica_matches(&mut cluster, after);
}

#[test]
fn queries_during_updates_see_each_vector_before_or_after() {
    for (name, layout) in LAYOUTS {
        eprintln!("layout: {name}");
        queries_during_updates_under(layout);
    }
}

fn queries_during_updates_under(layout: &str) {
    let cluster = Cluster::start_laid_out(3, 2, &[], layout);
    let mut oracle = loaded(&cluster, 14);
    let before = oracle.clone();
    let addr = cluster.master_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, before) = (stop.clone(), before.clone());
        thread::spawn(move || {
            let client = Client::connect(&addr).unwrap();
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for vid in 0..40u64 {
                    let answer = client.query(&format!("P:{vid}"), Format::Roaring);
                    seen.push((vid, answer));
                }
                let range = client.query("R:0-39", Format::Count);
                assert!(
                    matches!(range, Ok(Answer::Count(_))),
                    "R:0-39 failed: {range:?}"
                );
            }
            drop(before);
            seen
        })
    };
    let client = cluster.client();
    for round in 0..4u64 {
        let vids: Vec<u64> = (round * 10..round * 10 + 9).collect();
        let changes = some_bits(&oracle, &vids);
        clear(&cluster, &mut oracle, &changes);
        let gone = round * 10 + 9;
        assert_eq!(client.delete(&[(gone, gone)]).unwrap(), 1);
        oracle.delete(gone, gone);
    }
    stop.store(true, Ordering::Relaxed);
    let seen = watcher.join().unwrap();
    assert!(!seen.is_empty());
    for (vid, answer) in seen {
        let got = match answer {
            Ok(Answer::Roaring(bytes)) => Some(
                roaring::RoaringBitmap::deserialize_from(&bytes[..])
                    .unwrap()
                    .iter()
                    .collect::<BTreeSet<u32>>(),
            ),
            Err(Error::Query {
                kind: ErrorKind::NotFound,
                ..
            }) => None,
            other => panic!("P:{vid} during updates: {other:?}"),
        };
        let old = before.vectors.get(&vid);
        let new = oracle.vectors.get(&vid);
        assert!(
            got.as_ref() == old || got.as_ref() == new,
            "P:{vid} during updates was neither before nor after"
        );
    }
    assert_matches(&client, &oracle);
}

#[test]
fn a_delete_of_more_vectors_than_one_update_message_holds_is_applied_whole() {
    // One slave owns every vector, so its share of the delete is all of it:
    // more changes than one update message may carry (262,144), sent in pieces.
    let cluster = Cluster::start(1, 1);
    let client = cluster.client();
    crate::util::import_one_bit_each(&client, 300_000, 1000);
    assert_eq!(
        client.query("R:0-299999", Format::Count).unwrap(),
        Answer::Count(1000)
    );
    let run = cluster.cli(&["delete", "1-299998"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(stdout(&run), "deleted 299998 vectors\n");
    assert_answer(&client, "R:0-299999", &BTreeSet::from([0, 999]));
    assert_answer(&client, "P:299999", &BTreeSet::from([999]));
    for vid in [1, 262_144, 262_145, 299_998] {
        assert!(
            matches!(
                client.query(&format!("P:{vid}"), Format::Count),
                Err(Error::Query {
                    kind: ErrorKind::NotFound,
                    ..
                })
            ),
            "vector {vid} is deleted"
        );
    }
    // The slave deleted them too: a restarted master merges what the slave
    // holds into its catalog, and nothing comes back.
    let mut cluster = cluster;
    cluster.restart_master();
    wait_until_all_up(&cluster.client());
    assert_answer(&cluster.client(), "R:0-299999", &BTreeSet::from([0, 999]));
}
