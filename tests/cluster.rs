//! The query layer end to end: 4 real slaves and a master, vectors imported
//! through the CLI in both formats, every answer compared with the oracle in
//! all three result forms.

use std::collections::BTreeSet;

use bitfold_client::{Error, ErrorKind, Format};

use crate::util::{Cluster, Oracle, Rng, assert_answer, stderr, stdout};

/// The largest vid a cluster that cuts vectors (the default) stores.
const TOP: u64 = bitfold_server::pieces::MAX_CUT_VID;

/// Random vectors of mixed density at awkward vids and bits.
fn data(seed: u64) -> (Oracle, Oracle) {
    let mut rng = Rng(seed);
    let mut pairs = Oracle::default();
    let mut roaring = Oracle::default();
    let vector = |rng: &mut Rng, vid: u64| -> Vec<u32> {
        match vid % 4 {
            // Dense: about half of the first 2^17 bits.
            0 => (0..1u32 << 17)
                .filter(|_| rng.next_u64() & 1 == 1)
                .collect(),
            // About 1% of the first 2^20 bits.
            1 => (0..10_000).map(|_| rng.below(1 << 20) as u32).collect(),
            // A few bits anywhere, the top bit included sometimes.
            2 => (0..20)
                .map(|_| rng.next_u64() as u32)
                .chain((vid % 8 == 2).then_some(u32::MAX))
                .collect(),
            // A run across a container boundary.
            _ => (65_000..66_000).collect(),
        }
    };
    for vid in (0..26).chain([TOP - 2, 7_000_000_000]) {
        let bits = vector(&mut rng, vid);
        pairs.add(vid, bits);
    }
    for vid in (20..40).chain([TOP - 1, TOP, 1000]) {
        let bits = if vid == 1000 {
            vec![u32::MAX - 3, u32::MAX]
        } else {
            vector(&mut rng, vid)
        };
        roaring.add(vid, bits);
    }
    (pairs, roaring)
}

fn import_both(cluster: &Cluster, pairs: &Oracle, roaring: &Oracle) -> Oracle {
    let pairs_file = cluster.dir().join("input.csv");
    pairs.write_pairs(&pairs_file);
    let run = cluster.cli(&["import", pairs_file.to_str().unwrap()]);
    assert!(
        run.status.success(),
        "pairs import failed: {}",
        stderr(&run)
    );
    let roaring_dir = cluster.dir().join("roaring-input");
    roaring.write_roaring(&roaring_dir);
    let run = cluster.cli(&[
        "import",
        "--format",
        "roaring",
        roaring_dir.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "roaring import failed: {}",
        stderr(&run)
    );
    let mut all = pairs.clone();
    for (&vid, bits) in &roaring.vectors {
        all.add(vid, bits.iter().copied());
    }
    all
}

fn range_terms(rng: &mut Rng) -> Vec<(u64, u64)> {
    let terms = 1 + rng.below(4) as usize;
    (0..terms)
        .map(|_| match rng.below(5) {
            0 => (0, TOP),
            1 => (TOP - rng.below(4), TOP),
            _ => {
                let first = rng.below(45);
                (first, first + rng.below(20))
            }
        })
        .collect()
}

fn check_cluster(replicas: usize, seed: u64) {
    let cluster = Cluster::start(4, replicas);
    let (pairs, roaring) = data(seed);
    let oracle = import_both(&cluster, &pairs, &roaring);
    let client = cluster.client();

    for (&vid, bits) in &oracle.vectors {
        assert_answer(&client, &format!("P:{vid}"), bits);
    }
    for missing in [40u64, 999, TOP - 3] {
        match client.query(&format!("P:{missing}"), Format::Count) {
            Err(Error::Query {
                kind: ErrorKind::NotFound,
                message,
                ..
            }) => {
                assert!(message.contains(&missing.to_string()), "{message}")
            }
            other => panic!("P:{missing} should be not found, got {other:?}"),
        }
    }
    let fixed: &[&[(u64, u64)]] = &[
        &[(0, 39)],
        &[(0, 10), (5, 20)],
        &[(3, 3)],
        &[(20, 25)],
        &[(0, 5), (100, 200)],
        &[(100, 200)],
        &[(0, TOP)],
        &[(TOP - 3, TOP)],
        &[(10, 30), (10, 30), (0, TOP)],
        &[(1000, 1000), (0, TOP)],
        &[(2, 2), (6, 6), (10, 10), (0, TOP)],
    ];
    let mut rng = Rng(seed ^ 0xabcdef);
    let random: Vec<Vec<(u64, u64)>> = (0..25).map(|_| range_terms(&mut rng)).collect();
    for terms in fixed
        .iter()
        .copied()
        .chain(random.iter().map(Vec::as_slice))
    {
        assert_answer(&client, &Oracle::range_query(terms), &oracle.range(terms));
    }
    // A range with leading zeros and the whitespace the grammar allows.
    assert_answer(
        &client,
        " \tR:000-39&0020-0025\r\n",
        &oracle.range(&[(0, 39), (20, 25)]),
    );

    // The CLI's own forms agree too.
    let expected = oracle.range(&[(0, 10), (5, 20)]);
    let run = cluster.cli(&["query", "--output", "count", "R:0-10&5-20"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(stdout(&run).trim(), expected.len().to_string());
    let run = cluster.cli(&["query", "--output", "bits", "R:0-10&5-20"]);
    let bits: BTreeSet<u32> = stdout(&run).lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(bits, expected);
    let out = cluster.dir().join("answer.roaring");
    let run = cluster.cli(&[
        "query",
        "--output",
        "roaring",
        "--out",
        out.to_str().unwrap(),
        "R:0-10&5-20",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let bitmap =
        roaring::RoaringBitmap::deserialize_from(&std::fs::read(&out).unwrap()[..]).unwrap();
    assert_eq!(bitmap.iter().collect::<BTreeSet<_>>(), expected);
    let run = cluster.cli(&["query", "R:0-10&5-20"]);
    assert!(
        stdout(&run).contains(&format!("{} bits set", expected.len())),
        "{}",
        stdout(&run)
    );
}

#[test]
fn answers_are_exact_with_one_copy() {
    check_cluster(1, 1);
}

#[test]
fn answers_are_exact_with_two_copies() {
    check_cluster(2, 2);
}

#[test]
fn importing_twice_changes_nothing() {
    let cluster = Cluster::start(4, 2);
    let (pairs, roaring) = data(3);
    let first = import_both(&cluster, &pairs, &roaring);
    let second = import_both(&cluster, &pairs, &roaring);
    assert_eq!(first.vectors, second.vectors);
    let client = cluster.client();
    assert_answer(
        &client,
        "R:0-18446744073709551615",
        &first.range(&[(0, TOP)]),
    );
    assert_answer(&client, "R:0-39&20-25", &first.range(&[(0, 39), (20, 25)]));
}

/// Every malformed message of docs/protocol.md §2: `badQuery` with the offset, exit code 3
/// from the CLI, and the cluster keeps answering.
#[test]
fn malformed_queries_are_refused_with_their_offset() {
    let cluster = Cluster::start(4, 1);
    let mut oracle = Oracle::default();
    oracle.add(5, [1, 2, 3]);
    let file = cluster.dir().join("small.csv");
    oracle.write_pairs(&file);
    assert!(
        cluster
            .cli(&["import", file.to_str().unwrap()])
            .status
            .success()
    );
    let client = cluster.client();

    let too_many_terms = format!("R:{}", vec!["1"; 10_001].join("&"));
    let too_long = format!("P:{}", "0".repeat(1 << 20));
    let cases: Vec<(String, usize)> = vec![
        ("".into(), 0),
        ("   ".into(), 3),
        ("X:1".into(), 0),
        ("p:1".into(), 0),
        ("P".into(), 1),
        ("P:".into(), 2),
        ("P:a".into(), 2),
        ("P:-1".into(), 2),
        ("P:1-2".into(), 3),
        ("P:1 2".into(), 3),
        ("P:18446744073709551616".into(), 2),
        ("R:".into(), 2),
        ("R:1-".into(), 4),
        ("R:-5".into(), 2),
        ("R:5-3".into(), 2),
        ("R:1&".into(), 4),
        ("R:1&&2".into(), 4),
        ("R:1;2".into(), 3),
        ("R:1,".into(), 4),
        ("R:1,2-1".into(), 4),
        ("R:1 &2".into(), 3),
        (" R:1-2x".into(), 6),
        ("R:1-18446744073709551616".into(), 4),
    ];
    for (message, offset) in &cases {
        match client.query(message, Format::Count) {
            Err(Error::Query {
                kind: ErrorKind::BadQuery,
                message: text,
                ..
            }) => {
                assert!(
                    text.contains(&format!("at byte {offset}")),
                    "{message:?}: expected the offset {offset} in {text:?}"
                );
            }
            other => panic!("{message:?} should be a bad query, got {other:?}"),
        }
    }
    for message in [&too_many_terms, &too_long] {
        match client.query(message, Format::Count) {
            Err(Error::Query {
                kind: ErrorKind::BadQuery,
                ..
            }) => {}
            other => panic!("an oversized query should be a bad query, got {other:?}"),
        }
    }
    let run = cluster.cli(&["query", "R:1-"]);
    assert_eq!(run.status.code(), Some(3));
    let err = stderr(&run);
    assert!(err.starts_with("error: bad query at byte 4"), "{err}");
    assert_eq!(err.lines().count(), 1, "one error line: {err}");
    let run = cluster.cli(&["query", "P:6"]);
    assert_eq!(run.status.code(), Some(4), "{}", stderr(&run));
    assert!(
        stderr(&run).starts_with("error: vector 6 not found"),
        "{}",
        stderr(&run)
    );

    assert_answer(&client, "P:5", &BTreeSet::from([1, 2, 3]));
}
