//! A real master and four slaves on 127.0.0.1, in threads of the test:
//! imports through the client, P and R queries in every form checked
//! against a `BTreeSet` oracle, malformed messages, hung and stopped slaves.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bitfold_client::{Answer, Error, ErrorKind, Format, LocalClient};
use bitfold_engine::{VectorBuf, portable};
use bitfold_server::master::PlanChoice;
use bitfold_server::pieces::MAX_CUT_VID;
use common::{Oracle, TestCluster, bits_of, check, import};

/// Vectors of every shape: sparse, dense runs, vids near 2^64 - 1, a vid
/// imported twice. Bits stay below 2^24 so that `words` answers stay small
/// (bits near 2^32 - 1 have their own test).
fn data() -> Vec<(u64, Vec<u32>)> {
    let mut vectors = Vec::new();
    for vid in 0..40u64 {
        let bits: Vec<u32> = match vid % 4 {
            0 => (0..50)
                .map(|i| (i * 7919 + vid as u32 * 31) % 300_000)
                .collect(),
            1 => (0..20_000).map(|i| i * 3 + vid as u32 % 3).collect(),
            2 => ((5 << 16)..(5 << 16) + 30_000)
                .chain([(1 << 24) - 1])
                .collect(),
            _ => vec![vid as u32, 65_535, 65_536, 1 << 23],
        };
        vectors.push((vid * 3, bits));
    }
    // The largest vids a cluster that cuts vectors stores.
    vectors.push((MAX_CUT_VID, vec![1, 2, 3, 70_000]));
    vectors.push((MAX_CUT_VID - 1, (0..1000).collect()));
    vectors.push((6, vec![123_456, 7])); // imported twice: union
    vectors
}

/// The pieces of 2^20 bits (the default) that `oracle`'s vectors hold bits in.
fn stored_pieces(oracle: &Oracle) -> usize {
    oracle
        .vectors
        .values()
        .map(|bits| {
            bits.iter()
                .map(|b| b >> 20)
                .collect::<BTreeSet<u32>>()
                .len()
        })
        .sum()
}

fn queries() -> Vec<(&'static str, Vec<(u64, u64)>)> {
    vec![
        ("R:0", vec![(0, 0)]),
        ("R:3-30", vec![(3, 30)]),
        ("R:0-18446744073709551615", vec![(0, u64::MAX)]),
        ("R:0-60&30-90", vec![(0, 60), (30, 90)]),
        ("R:3-9&3-9&6", vec![(3, 9), (3, 9), (6, 6)]),
        ("R:1-119&4-4&0-200", vec![(1, 119), (4, 4), (0, 200)]),
        (
            "R:281474976710654-18446744073709551615",
            vec![(MAX_CUT_VID - 1, u64::MAX)],
        ),
        (
            "R:281474976710655&0-10",
            vec![(MAX_CUT_VID, MAX_CUT_VID), (0, 10)],
        ),
        ("R:1-2", vec![(1, 2)]),
        ("R:0-100&1000-2000", vec![(0, 100), (1000, 2000)]),
        ("R:6&9", vec![(6, 6), (9, 9)]),
        ("R:0-119&0-119&0-119&0-119&0-119", vec![(0, 119); 5]),
    ]
}

fn queries_match_the_oracle(replicas: usize) {
    let cluster = TestCluster::start(4, replicas);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    for (message, terms) in queries() {
        check(&client, message, &oracle.range(&terms));
    }
    for vid in [0, 3, 6, 9, MAX_CUT_VID, MAX_CUT_VID - 1] {
        check(&client, &format!("P:{vid}"), &oracle.vectors[&vid]);
    }
    // Every piece of every vector (2^20 bits each) is held by exactly
    // `replicas` slaves.
    let held: u64 = cluster
        .stores()
        .iter()
        .map(|s| s.snapshot().vector_count())
        .sum();
    let pieces = stored_pieces(&oracle);
    assert!(pieces > oracle.vectors.len(), "some vectors are cut");
    assert_eq!(held, (pieces * replicas) as u64);
}

#[test]
fn queries_match_the_oracle_with_one_copy() {
    queries_match_the_oracle(1);
}

#[test]
fn queries_match_the_oracle_with_two_copies() {
    queries_match_the_oracle(2);
}

#[test]
fn every_u64_is_a_vid_where_vectors_are_whole_and_cut_clusters_name_their_bound() {
    let whole = TestCluster::start_with(3, 1, |o| o.cluster.piece = bitfold_server::pieces::WHOLE);
    let client = whole.client();
    let mut oracle = Oracle::default();
    let vectors = vec![
        (u64::MAX, vec![1, 2, 3, 70_000, 1 << 31]),
        (u64::MAX - 1, (0..1000).collect()),
        (5, vec![2, 1 << 31]),
    ];
    import(&client, &mut oracle, &vectors);
    check(
        &client,
        "P:18446744073709551615",
        &oracle.vectors[&u64::MAX],
    );
    check(
        &client,
        "R:18446744073709551614-18446744073709551615&0-10",
        &oracle.range(&[(u64::MAX - 1, u64::MAX), (0, 10)]),
    );
    let cut = TestCluster::start(3, 1);
    let client = cut.client();
    let big = VectorBuf::from_bits(vec![1]);
    let err = client
        .import(&[(7, big.as_part()), (MAX_CUT_VID + 1, big.as_part())])
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::BadQuery), "{err}");
    assert!(err.to_string().contains("at most 281474976710655"), "{err}");
    assert_eq!(
        client
            .query("R:0-18446744073709551615", Format::Count)
            .unwrap(),
        Answer::Count(0),
        "nothing was imported"
    );
}

#[test]
fn every_coordinator_policy_gives_the_same_answers() {
    for policy in ["random", "bandwidth"] {
        let cluster = TestCluster::start_with(4, 2, |o| o.policy = policy.parse().unwrap());
        let client = cluster.client();
        let mut oracle = Oracle::default();
        import(&client, &mut oracle, &data());
        for (message, terms) in queries().into_iter().take(6) {
            check(&client, message, &oracle.range(&terms));
        }
    }
}

#[test]
fn the_last_bit_counts_but_does_not_fit_as_words() {
    let cluster = TestCluster::start_with(4, 1, |o| {
        o.rpc_timeout = Duration::from_secs(120);
        o.query_timeout = Duration::from_secs(240);
    });
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(
        &client,
        &mut oracle,
        &[(7, vec![0, u32::MAX]), (8, vec![u32::MAX - 64])],
    );
    assert_eq!(
        client.query("P:7", Format::Count).unwrap(),
        Answer::Count(2)
    );
    assert_eq!(
        client.query("R:7-8", Format::Count).unwrap(),
        Answer::Count(3)
    );
    let expected: BTreeSet<u32> = [0, u32::MAX].into();
    assert_eq!(
        bits_of(&client.query("P:7", Format::Roaring).unwrap()),
        expected
    );
    for message in ["P:7", "R:7-8", "R:7&0-10"] {
        match client.query(message, Format::Words) {
            Err(err) => {
                assert_eq!(err.kind(), Some(ErrorKind::TooLarge), "{message}: {err}");
                assert!(err.to_string().contains("count"), "{err}");
            }
            Ok(_) => panic!("{message} answered words for bit 2^32 - 1"),
        }
    }
    // Bit 2^32 - 65 is the last that fits as words (2^29 - 8 bytes).
    let Answer::Words(words) = client.query("R:8", Format::Words).unwrap() else {
        panic!("words asked")
    };
    assert_eq!(words.len(), (1 << 29) - 8);
    assert_eq!(words[words.len() - 8..], (1u64 << 63).to_le_bytes());
    drop(words);
    import(&client, &mut oracle, &[(9, vec![u32::MAX - 65, 3])]);
    check(&client, "R:9", &oracle.range(&[(9, 9)]));
}

#[test]
fn a_vector_too_big_for_one_part_travels_in_several() {
    // Half a GiB moves per call: time enough even for a loaded machine.
    let cluster = TestCluster::start_with(2, 1, |o| {
        o.rpc_timeout = Duration::from_secs(120);
        o.query_timeout = Duration::from_secs(240);
    });
    let client = cluster.client();
    // One dense container more than a wire part holds.
    let containers = bitfold_engine::PART_MAX_DENSE as u16 + 1;
    let mut full = VectorBuf::new();
    for key in 0..containers {
        full.push_dense(key, &[u64::MAX; 1024]).unwrap();
    }
    let small = VectorBuf::from_bits(vec![5, u32::MAX]);
    client
        .import(&[(1, full.as_part()), (2, small.as_part())])
        .unwrap();
    drop(full);
    let count = u64::from(containers) << 16;
    assert_eq!(
        client.query("P:1", Format::Count).unwrap(),
        Answer::Count(count)
    );
    assert_eq!(
        client.query("R:1-2", Format::Count).unwrap(),
        Answer::Count(count + 1)
    );
    assert_eq!(
        client.query("R:1&2", Format::Count).unwrap(),
        Answer::Count(1)
    );
    let Answer::Roaring(bytes) = client.query("R:1-2", Format::Roaring).unwrap() else {
        panic!("roaring asked")
    };
    let union = portable::read(&bytes).unwrap();
    assert_eq!(union.as_part().cardinality(), count + 1);
    assert!(union.as_part().contains(u32::MAX) && union.as_part().contains(count as u32 - 1));
    let Answer::Words(words) = client.query("R:1&2", Format::Words).unwrap() else {
        panic!("words asked")
    };
    assert_eq!(words[..], 32u64.to_le_bytes());
}

#[test]
fn empty_terms_and_missing_vectors() {
    let cluster = TestCluster::start(4, 1);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &[(10, vec![1, 2]), (11, vec![])]);
    let empty = BTreeSet::new();
    check(&client, "R:500-600", &empty);
    check(&client, "R:10&500", &empty);
    assert_eq!(
        client.query("R:11", Format::Words).unwrap(),
        Answer::Words(Default::default())
    );
    let err = client.query("P:11", Format::Count).unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::NotFound));
    assert_eq!(err.to_string(), "vector 11 not found");
    let err = client
        .query("P:18446744073709551615", Format::Words)
        .unwrap_err();
    assert_eq!(err.to_string(), "vector 18446744073709551615 not found");
}

#[test]
fn malformed_messages_are_bad_queries_and_the_server_keeps_answering() {
    let cluster = TestCluster::start(4, 1);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &[(1, vec![4, 5]), (2, vec![5])]);
    let cases = [
        ("", 0),
        ("X:1", 0),
        ("P1", 1),
        ("R:", 2),
        ("R:1-", 4),
        ("R:1-x", 4),
        ("R:2-1", 2),
        ("R:1&&2", 4),
        ("R:1 & 2", 3),
        ("P:18446744073709551616", 2),
        ("  P:1 x", 5),
    ];
    for (message, offset) in cases {
        let err = client.query(message, Format::Count).unwrap_err();
        assert_eq!(err.kind(), Some(ErrorKind::BadQuery), "{message:?}: {err}");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("bad query at byte {offset}: ")),
            "{message:?}: {text}"
        );
        check(&client, "R:1&2", &oracle.range(&[(1, 1), (2, 2)]));
    }
    let err = client.query("R:1-x", Format::Count).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad query at byte 4: expected a digit after '-'"
    );
    let long = format!("R:{}", "1&".repeat(600_000));
    let err = client.query(&long, Format::Count).unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::BadQuery));
    check(&client, " R:1\r\n", &oracle.range(&[(1, 1)]));
}

#[test]
fn a_hung_slave_is_replaced_by_its_replica() {
    let mut cluster = TestCluster::start(4, 2);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    cluster.hang_slave(1);
    let started = Instant::now();
    for (message, terms) in queries() {
        check(&client, message, &oracle.range(&terms));
    }
    check(&client, "P:3", &oracle.vectors[&3]);
    assert!(started.elapsed() < Duration::from_secs(60));
    let status = client.status().unwrap();
    assert!(!status[1].up, "{:?}", status[1]);
    assert!(status[1].reason.is_some());
    assert!(status[0].up && status[2].up && status[3].up);
}

#[test]
fn without_a_replica_a_hung_slave_makes_the_answer_unavailable_until_it_returns() {
    let mut cluster = TestCluster::start(4, 1);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    cluster.hang_slave(2);
    let err = client
        .query("R:0-18446744073709551615", Format::Count)
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Unavailable), "{err}");
    let Some(bitfold_client::Error::Query {
        failed_machines, ..
    }) = Some(err.clone())
    else {
        unreachable!()
    };
    assert_eq!(failed_machines, vec!["s2".to_string()], "{err}");
    // Now known down: refused at once, naming it.
    let err = client
        .query("R:0-18446744073709551615", Format::Words)
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("unavailable: no live owner for "),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("s2 ({})", cluster.addrs[2])),
        "{err}"
    );
    // A query that needs no vector of s2 still answers.
    let elsewhere: Vec<u64> = oracle
        .vectors
        .keys()
        .copied()
        .filter(|&v| bitfold_server::placement::primary(v, 4) != 2)
        .collect();
    let vid = elsewhere[0];
    check(&client, &format!("R:{vid}"), &oracle.vectors[&vid]);
    // It comes back and is used again.
    cluster.restart_slave(2);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.query("R:0-18446744073709551615", Format::Count) {
            Ok(answer) => {
                let all = oracle.range(&[(0, u64::MAX)]).len() as u64;
                assert_eq!(answer, Answer::Count(all));
                break;
            }
            Err(err) if Instant::now() < deadline => {
                assert_eq!(err.kind(), Some(ErrorKind::Unavailable), "{err}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(err) => panic!("the slave never came back: {err}"),
        }
    }
}

#[test]
fn restarted_slaves_are_used_at_once() {
    let mut cluster = TestCluster::start(4, 1);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    check(&client, "R:0-60", &oracle.range(&[(0, 60)]));
    for i in 0..4 {
        cluster.restart_slave(i);
    }
    // The old connections closed with the old processes: no slave is
    // taken for down, the first query after the restart answers.
    check(&client, "R:0-60", &oracle.range(&[(0, 60)]));
    check(&client, "P:3", &oracle.vectors[&3]);
}

#[test]
fn a_stopped_coordinator_is_replaced() {
    let mut cluster = TestCluster::start(3, 3);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    cluster.stop_slave(0);
    // Round robin puts every slave in turn as coordinator; all answer.
    for _ in 0..6 {
        check(&client, "R:0-60&30-90", &oracle.range(&[(0, 60), (30, 90)]));
    }
}

#[test]
fn an_import_with_an_owner_down_is_refused_naming_it() {
    let mut cluster = TestCluster::start(3, 2);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &[(1, vec![1])]);
    cluster.stop_slave(1);
    let owned_by_1 = (0..100u64)
        .find(|&v| bitfold_server::placement::owners(v, 3, 2).contains(&1) && v != 1)
        .unwrap();
    let buf = VectorBuf::from_bits(vec![9]);
    // The master finds s1 gone as it sends the import: the import is
    // recorded, applied by the other owner, and will be completed on s1.
    let err = client.import(&[(owned_by_1, buf.as_part())]).unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Unavailable), "{err}");
    assert!(err.to_string().contains("s1"), "{err}");
    assert!(
        err.to_string().contains("recorded but not yet complete"),
        "{err}"
    );
    oracle.add(owned_by_1, [9u32]);
    check(
        &client,
        &format!("P:{owned_by_1}"),
        &oracle.vectors[&owned_by_1],
    );
    // Now that s1 is known to be down, an import it owns is refused whole.
    let other = VectorBuf::from_bits(vec![10]);
    let err = client.import(&[(owned_by_1, other.as_part())]).unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Unavailable), "{err}");
    assert!(err.to_string().contains("nothing was changed"), "{err}");
    assert!(err.to_string().contains("s1"), "{err}");
    check(
        &client,
        &format!("P:{owned_by_1}"),
        &oracle.vectors[&owned_by_1],
    );
    cluster.restart_slave(1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.import(&[(owned_by_1, buf.as_part())]).is_err() {
        assert!(Instant::now() < deadline, "the slave never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    oracle.add(owned_by_1, [9u32]);
    check(
        &client,
        &format!("P:{owned_by_1}"),
        &oracle.vectors[&owned_by_1],
    );
}

#[test]
fn the_catalog_survives_a_master_restart() {
    let mut cluster = TestCluster::start(4, 1);
    let mut oracle = Oracle::default();
    import(&cluster.client(), &mut oracle, &data());
    cluster.restart_master();
    let client = cluster.client();
    check(
        &client,
        "R:0-18446744073709551615",
        &oracle.range(&[(0, u64::MAX)]),
    );
    let status = client.status().unwrap();
    assert_eq!(status.len(), 4);
    // Status counts what each slave stores: the pieces of vectors.
    let vectors: u64 = status.iter().map(|s| s.vectors).sum();
    let pieces = stored_pieces(&oracle);
    assert_eq!(vectors, pieces as u64);
    assert!(
        status
            .iter()
            .all(|s| s.up && s.reason.is_none() && s.bytes > 0)
    );
}

#[test]
fn the_catalog_is_rebuilt_from_the_slaves() {
    let mut cluster = TestCluster::start(4, 2);
    let mut oracle = Oracle::default();
    import(&cluster.client(), &mut oracle, &data());
    std::fs::remove_file(cluster.master_dir().join("catalog.log")).unwrap();
    cluster.restart_master();
    check(
        &cluster.client(),
        "R:0-18446744073709551615",
        &oracle.range(&[(0, u64::MAX)]),
    );
}

#[test]
fn clients_work_from_many_threads() {
    let cluster = TestCluster::start(4, 1);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (client, oracle) = (&client, &oracle);
            scope.spawn(move || {
                for i in 0..10 {
                    let first = (t * 13 + i * 7) % 120;
                    let message = format!("R:{first}-{}", first + 20);
                    check(client, &message, &oracle.range(&[(first, first + 20)]));
                }
            });
        }
    });
}

#[test]
fn a_local_client_answers_as_a_client_does() {
    let cluster = TestCluster::start(4, 1);
    let addr = cluster.master_addr();
    let local = LocalClient::connect(&addr).unwrap();
    let mut oracle = Oracle::default();
    import(&local, &mut oracle, &data());
    let client = cluster.client();
    for (message, terms) in queries() {
        let expected = oracle.range(&terms);
        check(&local, message, &expected);
        check(&client, message, &expected);
    }
    let vectors = |status: Vec<bitfold_client::SlaveStatus>| -> Vec<u64> {
        status.iter().map(|s| s.vectors).collect()
    };
    assert_eq!(
        vectors(local.status().unwrap()),
        vectors(client.status().unwrap())
    );
    let err = local.query("R:5-", Format::Count).unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::BadQuery), "{err}");
    check(&local, "R:3-30", &oracle.range(&[(3, 30)]));
}

#[test]
fn a_local_client_refuses_to_block_an_async_runtime() {
    let cluster = TestCluster::start(2, 1);
    let local = LocalClient::connect(&cluster.master_addr()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let err = runtime
        .block_on(async { local.query("R:0", Format::Count) })
        .unwrap_err();
    assert_eq!(err, Error::InsideRuntime);
    assert!(err.to_string().contains("use a Client"), "{err}");
    assert_eq!(
        local.query("R:0", Format::Count).unwrap(),
        Answer::Count(0),
        "outside the runtime it answers"
    );
}

#[test]
fn a_local_client_carries_on_after_a_master_restart() {
    let mut cluster = TestCluster::start(4, 1);
    let local = LocalClient::connect(&cluster.master_addr()).unwrap();
    let mut oracle = Oracle::default();
    import(&local, &mut oracle, &data());
    cluster.restart_master();
    // The master is on the same address; nothing read the old connection's
    // end while no call ran, yet the next call is answered.
    check(&local, "R:0-60&30-90", &oracle.range(&[(0, 60), (30, 90)]));
}

#[test]
fn connecting_to_nothing_says_how_to_fix_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let expected = format!(
        "cannot reach the master at {addr}: connection refused (start it with `bitfold up`)"
    );
    let err = bitfold_client::Client::connect(&addr).unwrap_err();
    assert_eq!(err.to_string(), expected);
    let err = LocalClient::connect(&addr).unwrap_err();
    assert_eq!(err.to_string(), expected);
}

#[test]
fn a_query_naming_too_many_vectors_is_refused() {
    let cluster = TestCluster::start_with(2, 1, |o| o.max_query_vectors = 10);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    let err = client
        .query("R:0-18446744073709551615", Format::Count)
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::TooLarge), "{err}");
    assert!(
        err.to_string().contains("more than 10 existing vectors"),
        "{err}"
    );
    // Repeated terms count once.
    check(&client, "R:0-21&0-21&0-21", &oracle.range(&[(0, 21)]));
}

#[test]
fn a_hung_coordinator_is_replaced() {
    let mut cluster = TestCluster::start(3, 1);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    // A vector that s0 does not hold: only s0 as coordinator can fail.
    let vid = *oracle
        .vectors
        .keys()
        .find(|&&v| bitfold_server::placement::primary(v, 3) != 0)
        .unwrap();
    cluster.hang_slave(0);
    // Round robin gives every slave a turn as coordinator.
    for _ in 0..3 {
        check(&client, &format!("R:{vid}"), &oracle.vectors[&vid]);
    }
    let status = client.status().unwrap();
    assert!(!status[0].up, "{:?}", status[0]);
    assert!(
        status[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("no answer within"),
        "{:?}",
        status[0]
    );
}

#[test]
fn out_of_attempts_names_every_failed_machine() {
    let mut cluster = TestCluster::start_with(3, 2, |o| o.attempts = 1);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    cluster.stop_slave(1);
    // One attempt: the first query meets the stopped slave and has no
    // second try; it fails naming it, and is never answered in part.
    let mut failures = 0;
    for _ in 0..3 {
        match client.query("R:0-18446744073709551615", Format::Count) {
            Ok(answer) => {
                let all = oracle.range(&[(0, u64::MAX)]).len() as u64;
                assert_eq!(answer, Answer::Count(all));
            }
            Err(err) => {
                failures += 1;
                assert_eq!(err.kind(), Some(ErrorKind::Unavailable), "{err}");
                let text = err.to_string();
                assert!(
                    text.starts_with("unavailable: no answer after 1 attempt; failed: s1 ("),
                    "{text}"
                );
                assert!(text.contains("connection refused"), "{text}");
            }
        }
    }
    assert_eq!(failures, 1, "only the query that found s1 down fails");
}

#[test]
fn a_slave_that_lost_its_vectors_is_never_read_as_empty() {
    let mut cluster = TestCluster::start(3, 2);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    cluster.restart_slave_empty(0);
    // Its replicas answer, exactly.
    for (message, terms) in queries().into_iter().take(6) {
        check(&client, message, &oracle.range(&terms));
    }
    for vid in [0, 3, 6, 9, 12, 15] {
        check(&client, &format!("P:{vid}"), &oracle.vectors[&vid]);
    }
    drop(client);
    drop(cluster);

    let mut cluster = TestCluster::start(3, 1);
    let client = cluster.client();
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    cluster.restart_slave_empty(0);
    let err = client
        .query("R:0-18446744073709551615", Format::Count)
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Unavailable), "{err}");
    // It lacks every piece it owns (vectors of up to 2^24 bits are cut).
    let placement = cluster.config.placement();
    let pieces = placement.pieces;
    let owned = oracle
        .vectors
        .iter()
        .flat_map(|(&vid, bits)| {
            let cut: BTreeSet<u32> = bits.iter().map(|&b| b >> 20).collect();
            cut.into_iter().map(move |piece| pieces.key(vid, piece))
        })
        .filter(|&key| placement.owners(key) == [0])
        .count();
    assert!(owned > 13, "{owned} pieces on s0");
    let lacks = format!("lacks {owned} of its vectors");
    assert!(err.to_string().contains(&lacks), "{err}");
    // No other owner holds them: as the error says, they are deleted and
    // imported again.
    assert!(
        err.to_string().contains("delete it and import it again"),
        "{err}"
    );
    let deleted = client.delete(&[(0, u64::MAX)]).unwrap();
    assert_eq!(deleted, oracle.vectors.len() as u64);
    let mut oracle = Oracle::default();
    import(&client, &mut oracle, &data());
    for (message, terms) in queries() {
        check(&client, message, &oracle.range(&terms));
    }
}

#[test]
fn random_queries_match_the_oracle() {
    // Both plans, each with vids placed one by one, in groups of 16 and 64
    // and all together (the default), vectors cut into the default pieces
    // (the vectors span five); and cut into pieces of one container, in
    // groups of 16 or all vids together.
    use bitfold_server::pieces::DEFAULT_PIECE;
    use bitfold_server::placement::GROUP_ALL;
    for plan in [PlanChoice::Chain, PlanChoice::FanOut] {
        for (group, piece) in [
            (1, DEFAULT_PIECE),
            (16, DEFAULT_PIECE),
            (64, DEFAULT_PIECE),
            (GROUP_ALL, DEFAULT_PIECE),
            (16, 1 << 16),
            (GROUP_ALL, 1 << 16),
        ] {
            random_queries_match_the_oracle_under(plan, group, piece);
        }
    }
}

fn random_queries_match_the_oracle_under(plan: PlanChoice, group: u64, piece: u64) {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    let cluster = TestCluster::start_with(4, 2, |o| {
        o.plan = plan;
        o.cluster.group = group;
        o.cluster.piece = piece;
    });
    let client = cluster.client();
    let mut oracle = Oracle::default();
    let mut rng = StdRng::seed_from_u64(7);
    let vectors: Vec<(u64, Vec<u32>)> = (0..60)
        .map(|_| {
            let vid = rng.random_range(0..200u64);
            let base = rng.random_range(0..64u32) << 16;
            let len = if rng.random_bool(0.3) { 5_000 } else { 40 };
            let bits = (0..len)
                .map(|_| base + rng.random_range(0..3 << 16))
                .collect();
            (vid, bits)
        })
        .collect();
    import(&client, &mut oracle, &vectors);
    let what = format!("{plan:?}, group {group}, piece {piece}");
    let non_empty = random_queries(&client, &oracle, &mut rng, 40);
    assert!(
        non_empty >= 10,
        "{what}: only {non_empty} answers hold bits"
    );
    // Every piece of a vector is fetched, cleared and deleted.
    for (vid, bits) in oracle.vectors.iter().take(12) {
        check(&client, &format!("P:{vid}"), bits);
    }
    let cleared: Vec<(u64, Vec<u32>)> = oracle
        .vectors
        .iter()
        .step_by(3)
        .map(|(&vid, bits)| (vid, bits.iter().copied().step_by(2).collect()))
        .collect();
    let bufs: Vec<(u64, VectorBuf)> = cleared
        .iter()
        .map(|(vid, bits)| (*vid, VectorBuf::from_bits(bits.clone())))
        .collect();
    let parts: Vec<_> = bufs.iter().map(|(vid, b)| (*vid, b.as_part())).collect();
    let lost = cleared
        .iter()
        .filter(|(vid, bits)| oracle.clear(*vid, bits))
        .count();
    assert_eq!(
        client.clear(&parts).unwrap(),
        lost as u64,
        "{what}: cleared"
    );
    let gone = oracle.delete(0, 60);
    assert_eq!(
        client.delete(&[(0, 60)]).unwrap(),
        gone as u64,
        "{what}: deleted"
    );
    for (vid, bits) in oracle.vectors.iter().take(12) {
        check(&client, &format!("P:{vid}"), bits);
    }
    let err = client.query("P:0", Format::Count).unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::NotFound), "{what}: {err}");
    random_queries(&client, &oracle, &mut rng, 20);
}

/// Checks `n` random range queries of up to four terms over vids 0 to 270
/// against `oracle`; returns how many answers held bits.
fn random_queries(
    client: &bitfold_client::Client,
    oracle: &Oracle,
    rng: &mut rand::rngs::StdRng,
    n: usize,
) -> usize {
    use rand::Rng;

    let mut non_empty = 0;
    for _ in 0..n {
        // Each term the OR of one to three spans, which may overlap.
        let terms: Vec<Vec<(u64, u64)>> = (0..rng.random_range(1..5))
            .map(|_| {
                (0..rng.random_range(1..4))
                    .map(|_| {
                        let first = rng.random_range(0..210u64);
                        (first, first + rng.random_range(0..60u64))
                    })
                    .collect()
            })
            .collect();
        let text: Vec<String> = terms
            .iter()
            .map(|spans| {
                let spans: Vec<String> = spans.iter().map(|(a, b)| format!("{a}-{b}")).collect();
                spans.join(",")
            })
            .collect();
        let expected = terms
            .iter()
            .map(|spans| {
                spans
                    .iter()
                    .flat_map(|&span| oracle.range(&[span]))
                    .collect::<BTreeSet<u32>>()
            })
            .reduce(|acc, union| acc.intersection(&union).copied().collect())
            .unwrap_or_default();
        non_empty += usize::from(!expected.is_empty());
        check(client, &format!("R:{}", text.join("&")), &expected);
    }
    non_empty
}

/// Vectors whose ORs are all ones in some containers: key 0 is full once
/// two vids of opposite parity are ORed, key 1 once three of each residue
/// modulo 3; key 2 never is. Terms spread over machines (one vid per group)
/// send those containers as keys alone: every answer form, by both plans,
/// is what it would be otherwise.
#[test]
fn full_containers_travel_as_keys_and_answers_stay_exact() {
    let vectors: Vec<(u64, Vec<u32>)> = (0..24u32)
        .map(|v| {
            let half = (0..1 << 16).filter(|b| b % 2 == v % 2);
            let third = (1 << 16..2 << 16).filter(|b| b % 3 == v % 3);
            let few = [(2 << 16) + v * 7, (2 << 16) + 1000 + v];
            (u64::from(v) * 5, half.chain(third).chain(few).collect())
        })
        .collect();
    for plan in [PlanChoice::Chain, PlanChoice::FanOut] {
        let cluster = TestCluster::start_with(4, 1, |o| {
            o.plan = plan;
            o.cluster.group = 1;
        });
        let client = cluster.client();
        let mut oracle = Oracle::default();
        import(&client, &mut oracle, &vectors);
        let full_then_some = oracle.range(&[(0, 115)]);
        assert!(full_then_some.len() > 2 << 16, "keys 0 and 1 are full");
        for (message, terms) in [
            ("R:0-115", vec![(0, 115)]),
            ("R:0-5", vec![(0, 5)]),
            ("R:0-115&0-10", vec![(0, 115), (0, 10)]),
            ("R:0-115&20-60&5-100", vec![(0, 115), (20, 60), (5, 100)]),
            ("R:0&0-115", vec![(0, 0), (0, 115)]),
        ] {
            check(&client, message, &oracle.range(&terms));
        }
    }
}
