//! Cluster membership (docs/protocol.md §9) on real processes: a slave back
//! without its data is not asked for what it lacks, is refilled from its
//! partners, and a lost vector is `unavailable`, never answered without it.

use std::collections::BTreeSet;
use std::process::Output;
use std::time::Duration;

use bitfold_client::{Answer, Client, Error, ErrorKind, Format};

use crate::util::{
    Cluster, LAYOUTS, Oracle, assert_answer, placement_of, stderr, stored_keys, wait_until_all_up,
};

fn load(cluster: &Cluster, seed: u64) -> Oracle {
    Oracle::load(cluster, seed, 48, 200, 100_000)
}

/// Every vid of 0..48 answers as the oracle says (a deleted one is not
/// found), and so do ranges over them.
fn assert_all(client: &Client, oracle: &Oracle) {
    for vid in 0..48u64 {
        match oracle.vectors.get(&vid) {
            Some(bits) => assert_answer(client, &format!("P:{vid}"), bits),
            None => match client.query(&format!("P:{vid}"), Format::Count) {
                Err(Error::Query {
                    kind: ErrorKind::NotFound,
                    ..
                }) => {}
                other => panic!("P:{vid} was deleted, got {other:?}"),
            },
        }
    }
    for terms in [&[(0, 47)][..], &[(0, 23), (12, 40)], &[(7, 7), (0, 9)]] {
        assert_answer(client, &Oracle::range_query(terms), &oracle.range(terms));
    }
}

/// Waits until slave `i` reports holding `vectors` vectors.
fn wait_for_vectors(client: &Client, i: usize, vectors: u64) {
    for _ in 0..1200 {
        let status = client.status().unwrap();
        if status[i].up && status[i].vectors == vectors {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "slave {i} never held {vectors} vectors: {:?}",
        client.status()
    );
}

#[test]
fn a_wiped_slave_is_routed_around_and_refilled_from_its_partners() {
    let mut cluster = Cluster::start(4, 2);
    let oracle = load(&cluster, 21);
    let client = cluster.client();
    let held = client.status().unwrap()[2].vectors;
    assert!(held > 0);
    cluster.kill_slave(2);
    std::fs::remove_dir_all(cluster.slave_dir(2)).unwrap();
    cluster
        .restart_slave(2)
        .expect("s2 restarts with an empty directory");
    // Exact throughout: while s2 is refilled, its partners serve.
    for _ in 0..5 {
        assert_all(&client, &oracle);
    }
    wait_for_vectors(&client, 2, held);
    // The copies really exist: with each partner of s2 down in turn, s2 serves.
    for partner in [1, 3] {
        cluster.kill_slave(partner);
        assert_all(&client, &oracle);
        cluster
            .restart_slave(partner)
            .expect("the partner restarts");
        wait_for_vectors(&client, partner, client.status().unwrap()[partner].vectors);
    }
}

#[test]
fn with_one_replica_a_wiped_slave_s_vectors_are_unavailable_never_empty() {
    let mut cluster = Cluster::start(3, 1);
    let oracle = load(&cluster, 22);
    let client = cluster.client();
    cluster.kill_slave(0);
    std::fs::remove_dir_all(cluster.slave_dir(0)).unwrap();
    cluster
        .restart_slave(0)
        .expect("s0 restarts with an empty directory");
    let mut lost = 0;
    for _ in 0..3 {
        for vid in 0..48u64 {
            match client.query(&format!("P:{vid}"), Format::Roaring) {
                Ok(bitfold_client::Answer::Roaring(bytes)) => {
                    let got: BTreeSet<u32> = roaring::RoaringBitmap::deserialize_from(&bytes[..])
                        .unwrap()
                        .iter()
                        .collect();
                    assert_eq!(got, oracle.vectors[&vid], "P:{vid}");
                }
                Err(Error::Query {
                    kind: ErrorKind::Unavailable,
                    message,
                    ..
                }) => {
                    assert!(message.contains("s0"), "{message}");
                    lost += 1;
                }
                other => panic!("P:{vid}: {other:?}"),
            }
        }
        match client.query("R:0-47", Format::Count) {
            Err(Error::Query {
                kind: ErrorKind::Unavailable,
                ..
            }) => {}
            other => panic!("a range over lost vectors: {other:?}"),
        }
    }
    assert!(lost > 0, "s0 owned some of the 48 vectors");
    assert_eq!(
        client.status().unwrap()[0].vectors,
        0,
        "nothing to refill from"
    );
}

/// Vectors (pieces) each slave should hold under `slaves` slaves with
/// `replicas` copies, placed vid by vid.
fn owned(oracle: &Oracle, slaves: usize, replicas: usize) -> Vec<u64> {
    owned_under(LAYOUTS[0].1, oracle, slaves, replicas)
}

/// Vectors (pieces) each slave should hold under `slaves` slaves with
/// `replicas` copies, placed by `layout`.
fn owned_under(layout: &str, oracle: &Oracle, slaves: usize, replicas: usize) -> Vec<u64> {
    let placement = placement_of(layout, slaves, replicas);
    let mut counts = vec![0; slaves];
    for key in stored_keys(oracle, &placement) {
        for owner in placement.owners(key) {
            counts[owner] += 1;
        }
    }
    counts
}

/// Waits until every slave is up and holds exactly what it owns.
fn wait_until_placed(client: &Client, expected: &[u64]) {
    for _ in 0..1200 {
        let status = client.status().unwrap();
        let held: Vec<u64> = status.iter().map(|s| s.vectors).collect();
        if status.iter().all(|s| s.up) && held == expected {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("never placed as {expected:?}: {:?}", client.status());
}

/// With each slave down in turn, every answer is still exact: the copies
/// exist. `held` is what each slave holds.
fn assert_each_slave_can_fail(cluster: &mut Cluster, oracle: &Oracle, held: &[u64]) {
    let client = cluster.client();
    for (i, &vectors) in held.iter().enumerate() {
        cluster.kill_slave(i);
        assert_all(&client, oracle);
        cluster.restart_slave(i).expect("the slave restarts");
        wait_for_vectors(&client, i, vectors);
    }
}

/// Rewrites the cluster file to the first `slaves` slaves with `replicas`
/// copies and runs `bitfold rebalance`, which must succeed; its output.
fn rebalance_to(cluster: &Cluster, slaves: usize, replicas: usize) -> Output {
    cluster.write_cluster_file(slaves, replicas);
    let run = cluster.cli(&["rebalance"]);
    assert!(run.status.success(), "{}", stderr(&run));
    run
}

/// Waits until each slave holds exactly what it owns with `slaves` slaves
/// and `replicas` copies, then checks every answer with each slave down in
/// turn.
fn assert_placed_and_each_can_fail(
    cluster: &mut Cluster,
    oracle: &Oracle,
    slaves: usize,
    replicas: usize,
) {
    let held = owned(oracle, slaves, replicas);
    wait_until_placed(&cluster.client(), &held);
    assert_each_slave_can_fail(cluster, oracle, &held);
}

/// Rebalances step by step; between steps, queries answer exactly and
/// imports and clears of other vectors are applied (and kept after the move).
fn rebalance_under_load(cluster: &Cluster, oracle: &mut Oracle) {
    let client = cluster.client();
    let mut extra = 100u64;
    loop {
        let step = client.rebalance(8).expect("a rebalance step");
        assert_all(&client, &trimmed(oracle));
        let bits = [extra as u32, 7, 70_000];
        client
            .import(&[(
                extra,
                bitfold_engine::VectorBuf::from_bits(bits.to_vec()).as_part(),
            )])
            .unwrap();
        oracle.add(extra, bits);
        if extra > 100 {
            let cleared = bitfold_engine::VectorBuf::from_bits(vec![7]);
            assert_eq!(client.clear(&[(extra - 1, cleared.as_part())]).unwrap(), 1);
            oracle.clear(extra - 1, [7]);
        }
        extra += 1;
        if step.finished {
            break;
        }
    }
    for (&vid, bits) in oracle.vectors.range(100..) {
        assert_answer(&client, &format!("P:{vid}"), bits);
    }
}

/// The oracle's vectors 0..48, the ones `assert_all` checks.
fn trimmed(oracle: &Oracle) -> Oracle {
    Oracle {
        vectors: oracle
            .vectors
            .range(..48)
            .map(|(&v, b)| (v, b.clone()))
            .collect(),
    }
}

#[test]
fn a_fifth_slave_is_added_and_vectors_move_onto_it_online() {
    for (name, layout) in LAYOUTS {
        eprintln!("layout: {name}");
        a_fifth_slave_is_added_under(layout);
    }
}

fn a_fifth_slave_is_added_under(layout: &str) {
    let mut cluster = Cluster::start_laid_out(4, 2, &[], layout);
    // Bits up to 2^20: where the layout cuts vectors, 16 pieces each.
    let mut oracle = Oracle::load(&cluster, 23, 48, 200, 1_000_000);
    let client = cluster.client();
    cluster.add_slave();
    cluster.write_cluster_file(5, 2);
    assert!(!client.placement().unwrap().moving);
    // Interrupted (the master killed) after two steps, the move resumes.
    for _ in 0..2 {
        assert!(!client.rebalance(8).unwrap().finished);
    }
    let report = client.placement().unwrap();
    assert!(report.moving && report.misplaced > 0, "{report:?}");
    cluster.restart_master();
    wait_until_all_up(&cluster.client());
    assert!(
        cluster.client().placement().unwrap().moving,
        "the move is recorded"
    );
    rebalance_under_load(&cluster, &mut oracle);
    let client = cluster.client();
    let report = client.placement().unwrap();
    assert_eq!(
        (report.moving, report.misplaced, report.under_replicated),
        (false, 0, 0)
    );
    let held = owned_under(layout, &oracle, 5, 2);
    wait_until_placed(&client, &held);
    assert_each_slave_can_fail(&mut cluster, &trimmed(&oracle), &held);
    // Restarted, the master places by the new layout.
    cluster.restart_master();
    wait_until_placed(&cluster.client(), &owned_under(layout, &oracle, 5, 2));
    assert_all(&cluster.client(), &trimmed(&oracle));
}

/// A move onto a slave that is down stops with an error naming it (no hang,
/// nothing lost), queries stay exact, and once the slave is back the move
/// resumes and puts every vector on exactly its owners.
#[test]
fn a_move_onto_a_slave_that_is_down_stops_and_resumes_once_it_is_back() {
    let mut cluster = Cluster::start(4, 1);
    let oracle = load(&cluster, 29);
    let client = cluster.client();
    cluster.add_slave();
    cluster.write_cluster_file(5, 1);
    cluster.kill_slave(4);
    let err = client.rebalance(1000).expect_err("the new slave is down");
    assert!(err.to_string().contains("s4"), "{err}");
    assert_all(&client, &oracle);
    cluster.restart_slave(4).expect("the slave restarts");
    while !client.rebalance(1000).expect("a rebalance step").finished {}
    // Answered from the new layout at once: the master knows s4 is back.
    assert_all(&client, &oracle);
    wait_until_placed(&client, &owned(&oracle, 5, 1));
}

#[test]
fn the_last_slave_is_removed_after_its_vectors_moved_off() {
    let mut cluster = Cluster::start(4, 2);
    let oracle = load(&cluster, 24);
    let run = rebalance_to(&cluster, 3, 2);
    assert!(
        crate::util::stdout(&run).starts_with("every vector is on its owners"),
        "{}",
        crate::util::stdout(&run)
    );
    cluster.kill_slave(3);
    let client = cluster.client();
    assert_placed_and_each_can_fail(&mut cluster, &oracle, 3, 2);
    // Reordering is not an allowed edit: refused, nothing moved.
    let before = client.status().unwrap();
    std::fs::write(
        cluster.dir().join("cluster.toml"),
        format!(
            "replicas = 2\ngroup = 1\n[[slaves]]\nname = \"s1\"\naddr = \"{}\"\n[[slaves]]\nname = \"s0\"\naddr = \"{}\"\n",
            cluster.slave_addrs[1], cluster.slave_addrs[0]
        ),
    )
    .unwrap();
    let refused = cluster.cli(&["rebalance"]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("allowed edits"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(client.status().unwrap().len(), before.len());
    assert_all(&client, &oracle);
}

#[test]
fn raising_replicas_makes_every_vector_survive_one_failure() {
    let mut cluster = Cluster::start(3, 1);
    let oracle = load(&cluster, 25);
    rebalance_to(&cluster, 3, 2);
    assert_placed_and_each_can_fail(&mut cluster, &oracle, 3, 2);
}

#[test]
fn a_slave_replaced_by_a_new_machine_is_refilled() {
    let mut cluster = Cluster::start(4, 2);
    let oracle = load(&cluster, 26);
    cluster.replace_slave(1);
    rebalance_to(&cluster, 4, 2);
    let client = cluster.client();
    assert_all(&client, &oracle);
    assert_placed_and_each_can_fail(&mut cluster, &oracle, 4, 2);
}

/// Kills s1 of a 2-slave, 2-replica cluster and imports new bits into
/// every existing vector: the import is stored by s0 only and refused as
/// `unavailable`. Returns the oracle with those bits.
fn import_missed_by_s1(cluster: &mut Cluster, client: &Client, mut oracle: Oracle) -> Oracle {
    // The master believes s1 is up until a call to it fails: this import of
    // new bits into existing vectors is recorded, and stored by s0 only.
    cluster.kill_slave(1);
    let added: Vec<(u64, bitfold_engine::VectorBuf)> = (0..48u64)
        .map(|vid| {
            let bits = vec![150_000 + vid as u32, 200_000];
            (vid, bitfold_engine::VectorBuf::from_bits(bits))
        })
        .collect();
    let batch: Vec<_> = added.iter().map(|(vid, v)| (*vid, v.as_part())).collect();
    match client.import(&batch) {
        Err(Error::Query {
            kind: ErrorKind::Unavailable,
            message,
            ..
        }) if message.contains("recorded but not yet complete") => {}
        other => panic!("an import an owner missed: {other:?}"),
    }
    for vid in 0..48u64 {
        oracle.add(vid, [150_000 + vid as u32, 200_000]);
    }
    oracle
}

/// Restarts s1, waits until the master reports every vector on both
/// owners, then kills s0: s1 alone must answer with the import's bits
/// (it was caught up on the import it missed).
fn assert_s1_copied_back(cluster: &mut Cluster, oracle: &Oracle) {
    cluster.restart_slave(1).expect("s1 restarts");
    let client = cluster.client();
    for _ in 0..1200 {
        let status = client.status().unwrap();
        if status.iter().all(|s| s.up) && client.placement().unwrap().under_replicated == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(client.placement().unwrap().under_replicated, 0);
    // s1 alone answers with the import's bits: it applied the import it missed.
    cluster.kill_slave(0);
    assert_all(&client, oracle);
}

#[test]
fn an_owner_that_missed_an_import_is_caught_up_before_it_serves_those_vectors() {
    let mut cluster = Cluster::start(2, 2);
    let client = cluster.client();
    let oracle = load(&cluster, 27);
    let oracle = import_missed_by_s1(&mut cluster, &client, oracle);
    // s0 serves them meanwhile; s1 comes back without the import's bits,
    // and applies it from the master's journal before it serves.
    assert_all(&client, &oracle);
    assert_s1_copied_back(&mut cluster, &oracle);
}

#[test]
fn a_restarted_master_still_knows_which_owner_missed_an_import() {
    let mut cluster = Cluster::start(2, 2);
    let client = cluster.client();
    let oracle = load(&cluster, 28);
    let oracle = import_missed_by_s1(&mut cluster, &client, oracle);
    // Back, s1 holds every vid: only the master's journal of the import
    // keeps it from serving them without the import's bits.
    cluster.restart_master();
    assert_all(&cluster.client(), &oracle);
    assert_s1_copied_back(&mut cluster, &oracle);
}

#[test]
fn lowering_replicas_removes_more_surplus_copies_than_one_update_carries() {
    // Each slave holds all 600,000 vectors, and gives up half of them: more
    // deletes for one slave than one update message may carry (262,144).
    let cluster = Cluster::start(2, 2);
    let client = cluster.client();
    crate::util::import_one_bit_each(&client, 600_000, 4096);
    let run = rebalance_to(&cluster, 2, 1);
    let out = crate::util::stdout(&run);
    assert!(out.contains("removed 600000 surplus copies"), "{out}");
    let placement = bitfold_server::placement::Placement {
        slaves: 2,
        replicas: 1,
        group: 1,
        pieces: Default::default(),
    };
    let mut owned = vec![0u64; 2];
    for vid in 0..600_000 {
        owned[placement.owners(vid)[0]] += 1;
    }
    assert!(owned.iter().all(|&n| n > 262_144), "{owned:?}");
    wait_until_placed(&client, &owned);
    assert_eq!(
        client.query("R:0-599999", Format::Count).unwrap(),
        Answer::Count(4096)
    );
}

#[test]
fn a_copy_left_on_a_slave_that_no_longer_owns_it_does_not_bring_back_a_deleted_vector() {
    // Lowering replicas while s1 is down leaves its surplus copies on it;
    // a vector deleted afterwards (from its one owner) must stay deleted
    // when s1 comes back holding its old copy, and the copies be deleted.
    let mut cluster = Cluster::start(3, 2);
    let mut oracle = load(&cluster, 28);
    let client = cluster.client();
    let gone = (0..48u64)
        .find(|&vid| {
            let old = bitfold_server::placement::Placement {
                slaves: 3,
                replicas: 2,
                group: 1,
                pieces: Default::default(),
            };
            old.owners(vid)[1] == 1
        })
        .expect("s1 is the second owner of some vid");
    cluster.kill_slave(1);
    // The move is made, but s1, which owns a third of the vectors now, is
    // down: the cluster is not whole, and `rebalance` says so.
    cluster.write_cluster_file(3, 1);
    let run = cluster.cli(&["rebalance"]);
    assert_eq!(run.status.code(), Some(5), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("run `bitfold rebalance` again once the slaves are up")
            && stderr(&run).contains("s1"),
        "{}",
        stderr(&run)
    );
    assert!(client.query("R:0-47", Format::Count).is_err());
    assert_eq!(client.delete(&[(gone, gone)]).unwrap(), 1);
    oracle.delete(gone, gone);
    cluster.restart_slave(1).expect("s1 restarts with its data");
    wait_until_all_up(&client);
    // s1 has been probed and its catalog read: every vector as before, and
    // the deleted one stays gone.
    assert_all(&client, &oracle);
    let term = [(gone, gone), (0, 47)];
    assert_answer(&client, &Oracle::range_query(&term), &oracle.range(&term));
    // And the copies s1 no longer owns, the deleted one among them, are
    // gone from it: each slave holds exactly what it owns, and `rebalance`
    // finds the cluster whole.
    wait_until_placed(&client, &owned(&oracle, 3, 1));
    rebalance_to(&cluster, 3, 1);
}

/// The first vid of `oracle` that s3 owns in a cluster of 4 slaves with
/// 2 copies.
fn owned_by_s3(oracle: &Oracle) -> u64 {
    let placement = bitfold_server::placement::Placement {
        slaves: 4,
        replicas: 2,
        group: 1,
        pieces: Default::default(),
    };
    *oracle
        .vectors
        .keys()
        .find(|&&vid| placement.owners(vid).contains(&3))
        .expect("s3 owns some vid")
}

#[test]
fn a_slave_removed_with_an_update_pending_is_caught_up_when_it_is_added_back() {
    // s3 misses a clear (the master records it as waiting for s3), is
    // removed from the cluster, then added back with its old data: the
    // move that adds it must catch it up, not wait on itself.
    let mut cluster = Cluster::start(4, 2);
    let mut oracle = load(&cluster, 29);
    let client = cluster.client();
    let vid = owned_by_s3(&oracle);
    let bit = *oracle.vectors[&vid].first().unwrap();
    cluster.kill_slave(3);
    let cleared = bitfold_engine::VectorBuf::from_bits(vec![bit]);
    match client.clear(&[(vid, cleared.as_part())]) {
        Err(Error::Query { message, .. }) => assert!(
            message.contains("the write is recorded but not yet complete"),
            "{message}"
        ),
        other => panic!("a clear with s3 dead cannot complete: {other:?}"),
    }
    oracle.clear(vid, [bit]);
    rebalance_to(&cluster, 3, 2);
    assert_all(&client, &oracle);

    cluster
        .restart_slave(3)
        .expect("s3 restarts with its old data");
    cluster.write_cluster_file(4, 2);
    let (done, finished) = std::sync::mpsc::channel();
    let addr = cluster.master_addr();
    std::thread::spawn(move || {
        let client = Client::connect(&addr).unwrap();
        let moved = loop {
            match client.rebalance(2048) {
                Ok(progress) if !progress.finished => continue,
                other => break other.map(|_| ()),
            }
        };
        let _ = done.send(moved);
    });
    let moved = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the move adding s3 back finishes within a minute");
    moved.expect("the move adding s3 back succeeds");
    wait_until_all_up(&client);
    assert_all(&client, &oracle);
    assert_placed_and_each_can_fail(&mut cluster, &oracle, 4, 2);
}

#[test]
fn a_slave_added_back_with_old_data_serves_nothing_deleted_while_it_was_away() {
    // s3 is removed while down, so it keeps every copy it held; a vector
    // it owned is deleted; s3 is then added back with that data.
    let mut cluster = Cluster::start(4, 2);
    let mut oracle = load(&cluster, 30);
    let client = cluster.client();
    let gone = owned_by_s3(&oracle);
    cluster.kill_slave(3);
    // `status` probes every slave: s3 is known down, and the move copies
    // its vectors from their other owners.
    assert!(!client.status().unwrap()[3].up);
    rebalance_to(&cluster, 3, 2);
    assert_eq!(client.delete(&[(gone, gone)]).unwrap(), 1);
    oracle.delete(gone, gone);
    assert_all(&client, &oracle);

    cluster
        .restart_slave(3)
        .expect("s3 restarts with its old data");
    rebalance_to(&cluster, 4, 2);
    wait_until_all_up(&client);
    assert_all(&client, &oracle);
    assert_placed_and_each_can_fail(&mut cluster, &oracle, 4, 2);
}
