//! Clears, deletes and replaces ([`Store::update`]) against a naive oracle
//! (`BTreeMap<vid, BTreeSet<bit>>`): every read after every step, and after
//! reopening, equals the oracle's, with imports and merges interleaved.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bitfold_engine::fold::UnionPlan;
use bitfold_engine::store::{AGGREGATE_LEVELS, MERGE_FACTOR, Update};
use bitfold_engine::{CONTAINER_WORDS, Snapshot, Store, VectorBuf, VectorPart};
use proptest::prelude::*;

type Oracle = BTreeMap<u64, BTreeSet<u32>>;

/// One change, as owned data.
#[derive(Debug, Clone)]
enum Op {
    Set(u64, Vec<u32>),
    Clear(u64, Vec<u32>),
    Delete(u64),
    Replace(u64, Vec<u32>),
}

/// A step: an import of `Set`s, or an update batch of the others.
#[derive(Debug, Clone)]
enum Step {
    Import(Vec<Op>),
    Update(Vec<Op>),
}

fn vector(bits: &[u32]) -> VectorBuf {
    VectorBuf::from_bits(bits.to_vec())
}

/// Applies `step` to the store and the oracle; checks the vids the store
/// says changed.
fn apply(store: &Store, oracle: &mut Oracle, step: &Step) {
    match step {
        Step::Import(ops) => {
            let vectors: Vec<(u64, VectorBuf)> = ops
                .iter()
                .map(|op| match op {
                    Op::Set(vid, bits) => (*vid, vector(bits)),
                    other => panic!("an import holds only sets, not {other:?}"),
                })
                .collect();
            let batch: Vec<(u64, VectorPart<'_>)> =
                vectors.iter().map(|(vid, v)| (*vid, v.as_part())).collect();
            store.import(&batch).unwrap();
            for (vid, v) in &vectors {
                if !v.as_part().is_empty() {
                    oracle.entry(*vid).or_default().extend(v.as_part().bits());
                }
            }
        }
        Step::Update(ops) => {
            let vectors: Vec<VectorBuf> = ops
                .iter()
                .map(|op| match op {
                    Op::Clear(_, bits) | Op::Replace(_, bits) => vector(bits),
                    _ => VectorBuf::new(),
                })
                .collect();
            let batch: Vec<Update<'_>> = ops
                .iter()
                .zip(&vectors)
                .map(|(op, v)| match *op {
                    Op::Clear(vid, _) => Update::Clear(vid, v.as_part()),
                    Op::Delete(vid) => Update::Delete(vid),
                    Op::Replace(vid, _) => Update::Replace(vid, v.as_part()),
                    Op::Set(..) => panic!("an update holds no sets"),
                })
                .collect();
            let before = oracle.clone();
            for op in ops {
                match op {
                    Op::Clear(vid, bits) => {
                        if let Some(held) = oracle.get_mut(vid) {
                            bits.iter().for_each(|bit| {
                                held.remove(bit);
                            });
                        }
                    }
                    Op::Delete(vid) => {
                        oracle.remove(vid);
                    }
                    Op::Replace(vid, bits) => {
                        oracle.insert(*vid, bits.iter().copied().collect());
                    }
                    Op::Set(..) => unreachable!(),
                }
            }
            let touched: BTreeSet<u64> = ops.iter().map(vid_of).collect();
            let changed: Vec<u64> = touched
                .into_iter()
                .filter(|vid| before.get(vid) != oracle.get(vid))
                .collect();
            assert_eq!(store.update(&batch).unwrap().changed, changed);
        }
    }
}

fn vid_of(op: &Op) -> u64 {
    match *op {
        Op::Set(vid, _) | Op::Clear(vid, _) | Op::Delete(vid) | Op::Replace(vid, _) => vid,
    }
}

fn bits_of<'p>(parts: impl IntoIterator<Item = VectorPart<'p>>) -> BTreeSet<u32> {
    parts.into_iter().flat_map(|p| p.bits()).collect()
}

/// Every read of `snapshot` equals the oracle's: the vids, their count,
/// each vector, existence, and covers of several sets of vids (all held;
/// every other one; a contiguous range with vids not held; each block of
/// 16 alone).
fn assert_matches(snapshot: &Snapshot, oracle: &Oracle, probes: &BTreeSet<u64>) {
    let vids: Vec<u64> = snapshot.vids().collect();
    assert_eq!(vids, oracle.keys().copied().collect::<Vec<_>>());
    assert_eq!(snapshot.vector_count(), oracle.len() as u64);
    for &vid in probes.iter().chain(oracle.keys()) {
        assert_eq!(
            snapshot.contains(vid),
            oracle.contains_key(&vid),
            "vid {vid}"
        );
        let expected = oracle.get(&vid).cloned().unwrap_or_default();
        assert_eq!(bits_of(snapshot.parts(vid)), expected, "vid {vid}");
    }
    let every_other: Vec<u64> = vids.iter().copied().step_by(2).collect();
    let range: Vec<u64> = (0..4200).collect();
    let mut sets = vec![vids.clone(), every_other, range];
    let [width, ..] = AGGREGATE_LEVELS;
    sets.extend(
        vids.chunk_by(|a, b| a / width == b / width)
            .map(<[u64]>::to_vec),
    );
    for asked in sets {
        let expected: BTreeSet<u32> = asked
            .iter()
            .filter_map(|vid| oracle.get(vid))
            .flatten()
            .copied()
            .collect();
        assert_eq!(
            bits_of(snapshot.cover(&asked).parts),
            expected,
            "cover {asked:?}"
        );
    }
}

/// Runs `steps` on a store in `dir`, checking after each step and after
/// reopening the store.
fn run(dir: &Path, steps: &[Step]) {
    let mut store = Store::open(dir).unwrap();
    let mut oracle = Oracle::new();
    let probes: BTreeSet<u64> = steps
        .iter()
        .flat_map(|step| match step {
            Step::Import(ops) | Step::Update(ops) => ops.iter().map(vid_of).collect::<Vec<_>>(),
        })
        .collect();
    for step in steps {
        apply(&store, &mut oracle, step);
        assert_matches(&store.snapshot(), &oracle, &probes);
        drop(store);
        store = Store::open(dir).unwrap();
        assert_matches(&store.snapshot(), &oracle, &probes);
    }
}

/// Vids around the edges of aggregate blocks, so that updates mask them.
fn vid() -> impl Strategy<Value = u64> {
    prop_oneof![0..20u64, 250..262u64, 4090..4100u64]
}

/// Few sparse bits, or mostly a dense container's worth that many vectors
/// share (their unions stay small, so segments get aggregates) and a few
/// bits of their own.
fn bits() -> impl Strategy<Value = Vec<u32>> {
    let shared = (0..2u32, proptest::collection::vec(0..200u32, 0..4)).prop_map(|(key, own)| {
        let mut bits: Vec<u32> = (key << 16..(key << 16) + 400).collect();
        bits.extend(own);
        bits
    });
    prop_oneof![
        1 => proptest::collection::vec(0..200u32, 0..12),
        3 => shared,
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let set = (vid(), bits()).prop_map(|(vid, bits)| Op::Set(vid, bits));
    let update = prop_oneof![
        (vid(), bits()).prop_map(|(vid, bits)| Op::Clear(vid, bits)),
        vid().prop_map(Op::Delete),
        (vid(), bits()).prop_map(|(vid, bits)| Op::Replace(vid, bits)),
    ];
    // Batches without clears are written without rebuilding aggregates:
    // draw them on purpose too, whole blocks' worth of deletes included.
    let whole = prop_oneof![
        vid().prop_map(Op::Delete),
        (vid(), bits()).prop_map(|(vid, bits)| Op::Replace(vid, bits)),
    ];
    let run = (prop_oneof![Just(0u64), Just(252), Just(4092)], 1u64..9)
        .prop_map(|(first, len)| (first..first + len).map(Op::Delete).collect());
    prop_oneof![
        2 => proptest::collection::vec(set, 1..12).prop_map(Step::Import),
        1 => proptest::collection::vec(update, 1..6).prop_map(Step::Update),
        1 => proptest::collection::vec(whole, 1..6).prop_map(Step::Update),
        1 => run.prop_map(Step::Update),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random interleavings of imports and updates; with up to 30 steps, of
    /// one segment each, merges run several times.
    #[test]
    fn updates_match_the_oracle_through_merges_and_reopening(
        steps in proptest::collection::vec(step(), 1..30)
    ) {
        run(tempfile::tempdir().unwrap().path(), &steps);
    }
}

#[test]
fn clear_keeps_an_empty_vector_and_delete_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    run(
        dir.path(),
        &[
            Step::Import(vec![Op::Set(1, vec![1, 2]), Op::Set(2, vec![3])]),
            Step::Update(vec![Op::Clear(1, vec![1, 2]), Op::Delete(2)]),
            // Nothing to do: neither exists, or the bit is not there.
            Step::Update(vec![
                Op::Clear(2, vec![3]),
                Op::Delete(3),
                Op::Clear(1, vec![9]),
            ]),
            Step::Update(vec![
                Op::Replace(4, vec![]),
                Op::Delete(4),
                Op::Replace(4, vec![]),
            ]),
            Step::Import(vec![Op::Set(2, vec![5])]),
        ],
    );
}

#[test]
fn copies_onto_an_owner_that_holds_nothing_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    run(
        dir.path(),
        &[
            Step::Import(vec![Op::Set(5, vec![1, 2]), Op::Set(9, vec![7])]),
            Step::Update(vec![Op::Delete(5)]),
            // Only creates: written as an import; the old bits of 5 stay gone.
            Step::Update(vec![
                Op::Replace(5, vec![3]),
                Op::Replace(6, vec![4, 70_000]),
            ]),
            // Not only creates (9 exists): the general path.
            Step::Update(vec![Op::Replace(10, vec![8]), Op::Replace(9, vec![1])]),
            Step::Import(vec![Op::Set(5, vec![2])]),
        ],
    );
}

/// A vector at every 8th vid of the first block of the widest level, each
/// with a dense container and a bit of its own (4 MiB in all: one segment
/// of the first tier).
fn block_vectors() -> Vec<(u64, VectorBuf)> {
    (0..AGGREGATE_LEVELS[AGGREGATE_LEVELS.len() - 1])
        .step_by(8)
        .map(|vid| {
            let own = 1 << 17 | vid as u32;
            let mut bits: Vec<u32> = (0..(1 << 16)).step_by(7 + vid as usize % 5).collect();
            bits.push(own);
            (vid, VectorBuf::from_bits(bits))
        })
        .collect()
}

/// Imports tiny segments of vids far from the others until a merge takes
/// in every segment (the run of the first tier starts at the oldest).
fn compact(store: &Store) {
    for filler in 0.. {
        let v = VectorBuf::from_bits(vec![1]);
        let stats = store.import(&[(1 << 40 | filler, v.as_part())]).unwrap();
        if stats.merged_segments > 0 && store.snapshot().segment_count() == 1 {
            return;
        }
    }
}

#[test]
fn pending_clears_read_about_what_they_read_after_compaction() {
    let store = Store::in_memory();
    let vectors = block_vectors();
    let batch: Vec<(u64, VectorPart<'_>)> =
        vectors.iter().map(|(v, b)| (*v, b.as_part())).collect();
    store.import(&batch).unwrap();
    let cleared: Vec<VectorBuf> = (0..4096u64)
        .step_by(8 * 13)
        .map(|vid| VectorBuf::from_bits(vec![0, 1 << 17 | vid as u32]))
        .collect();
    let updates: Vec<Update<'_>> = (0..4096u64)
        .step_by(8 * 13)
        .zip(&cleared)
        .map(|(vid, bits)| Update::Clear(vid, bits.as_part()))
        .chain([Update::Delete(504), Update::Delete(4000)])
        .collect();
    let stats = store.update(&updates).unwrap();
    assert_eq!(stats.changed.len(), updates.len());
    let asked: Vec<u64> = store.snapshot().vids().collect();
    assert_eq!(asked.len(), 510);
    let pending = store.snapshot().cover(&asked).stats;
    let pending_bits = bits_of(store.snapshot().cover(&asked).parts);
    compact(&store);
    let compacted = store.snapshot().cover(&asked).stats;
    assert_eq!(bits_of(store.snapshot().cover(&asked).parts), pending_bits);
    // Vid 0's own bit was cleared, vid 504 deleted; vid 8 is untouched.
    assert!(!pending_bits.contains(&(1 << 17)) && !pending_bits.contains(&(1 << 17 | 504)));
    assert!(pending_bits.contains(&(1 << 17 | 8)));
    assert_eq!(
        pending.aggregates[AGGREGATE_LEVELS.len() - 1],
        1,
        "{pending:?}"
    );
    assert!(
        pending.bytes * 10 <= compacted.bytes * 12,
        "pending {pending:?} vs compacted {compacted:?}"
    );
}

/// What a move leaves on the slave it leaves: the vectors of a placement
/// group (64 consecutive vids) deleted from a block of the widest level. The
/// update writes the deletes alone (it reads none of the block's 4 MiB);
/// covers stay exact, before and after reopening, reading the block
/// through the levels below its aggregate; compaction brings back the
/// block's one aggregate.
#[test]
fn deleting_a_group_of_vids_writes_only_the_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let vectors = block_vectors();
    let batch: Vec<(u64, VectorPart<'_>)> =
        vectors.iter().map(|(v, b)| (*v, b.as_part())).collect();
    store.import(&batch).unwrap();
    let data = store.snapshot().byte_size();
    let group: Vec<Update<'_>> = (1024..1024 + 64).map(Update::Delete).collect();
    let stats = store.update(&group).unwrap();
    assert_eq!(
        stats.changed,
        (1024..1024 + 64).step_by(8).collect::<Vec<_>>()
    );
    assert!(
        stats.bytes * 100 < data,
        "deleting 8 of 512 vectors wrote {} bytes next to {data} of data",
        stats.bytes
    );
    let oracle: Oracle = vectors
        .iter()
        .filter(|(vid, _)| !(1024..1024 + 64).contains(vid))
        .map(|(vid, v)| (*vid, v.as_part().bits().collect()))
        .collect();
    let probes: BTreeSet<u64> = (1000..1100).collect();
    assert_matches(&store.snapshot(), &oracle, &probes);
    let asked: Vec<u64> = oracle.keys().copied().collect();
    let pending = store.snapshot().cover(&asked).stats;
    // Every 256-vid block but the one holding the group is read as its
    // aggregate; that one as its other 24 vectors (two per 16 vids are too
    // few for an aggregate below 256 vids), not the whole 4,096-vid block.
    let top = AGGREGATE_LEVELS.len() - 1;
    assert_eq!(pending.aggregates[top], 0, "{pending:?}");
    assert_eq!(pending.aggregates[top - 1], 15, "{pending:?}");
    assert_eq!(pending.vectors, (256 - 64) / 8, "{pending:?}");
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_matches(&store.snapshot(), &oracle, &probes);
    compact(&store);
    let mut oracle = oracle;
    // `compact`'s fillers, one bit each.
    oracle.extend(
        store
            .snapshot()
            .vids()
            .filter(|&vid| vid >= 1 << 40)
            .map(|vid| (vid, BTreeSet::from([1]))),
    );
    assert_matches(&store.snapshot(), &oracle, &probes);
    assert_eq!(store.snapshot().cover(&asked).stats.aggregates[top], 1);
}

/// An all-ones dense container for each key of `keys`.
fn dense(keys: std::ops::Range<u16>) -> VectorBuf {
    let mut v = VectorBuf::new();
    for key in keys {
        v.push_dense(key, &[u64::MAX; CONTAINER_WORDS]).unwrap();
    }
    v
}

/// The number of bits of the union of `parts`.
fn cardinality<'p>(parts: impl IntoIterator<Item = VectorPart<'p>>) -> u64 {
    let parts: Vec<VectorPart<'p>> = parts.into_iter().collect();
    let union = UnionPlan::new(&parts).run(&parts);
    union.iter().map(|v| v.as_part().cardinality()).sum()
}

/// Replaces before and after a big segment of the second size tier, and
/// small segments around it until the first tier merges: the run merged
/// takes the big segment in (it lies between them) and leaves the older big
/// one alone, and every vector reads as the updates left it.
#[test]
fn merges_keep_age_order_when_tiers_interleave() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // Over 8 MiB each: segments of the second tier.
    let (old, new) = (dense(2000..3030), dense(0..1030));
    store
        .import(&[(3, old.as_part()), (4, old.as_part())])
        .unwrap();
    // Bits outside both big vectors' containers.
    let (small_bit, replaced_bit) = (1500 << 16 | 1, 1500 << 16 | 30);
    let one = VectorBuf::from_bits(vec![small_bit]);
    store
        .import(&[(3, one.as_part()), (5, one.as_part())])
        .unwrap();
    let thirty = VectorBuf::from_bits(vec![replaced_bit]);
    store
        .update(&[Update::Replace(3, thirty.as_part())])
        .unwrap();
    store
        .import(&[(3, new.as_part()), (4, new.as_part())])
        .unwrap();
    let forty = VectorBuf::from_bits(vec![40]);
    store
        .update(&[Update::Replace(4, forty.as_part())])
        .unwrap();
    let mut merged = 0;
    for bit in 0..MERGE_FACTOR as u32 {
        let v = VectorBuf::from_bits(vec![bit]);
        merged += store.import(&[(5, v.as_part())]).unwrap().merged_segments;
    }
    assert!(merged >= MERGE_FACTOR, "the first tier was merged");
    let check = |snapshot: &Snapshot| {
        let three = new.as_part().cardinality() + 1;
        assert_eq!(cardinality(snapshot.parts(3)), three);
        assert!(snapshot.parts(3).any(|p| p.contains(replaced_bit)));
        assert!(
            !snapshot
                .parts(3)
                .any(|p| p.contains(small_bit) || p.contains(2000 << 16))
        );
        assert_eq!(bits_of(snapshot.parts(4)), BTreeSet::from([40]));
        let mut five: BTreeSet<u32> = (0..MERGE_FACTOR as u32).collect();
        five.insert(small_bit);
        assert_eq!(bits_of(snapshot.parts(5)), five);
        assert_eq!(snapshot.vids().collect::<Vec<_>>(), [3, 4, 5]);
        let naive = cardinality([3, 4, 5].into_iter().flat_map(|vid| snapshot.parts(vid)));
        assert_eq!(cardinality(snapshot.cover(&[3, 4, 5]).parts), naive);
        // The older big segment is still there, under the merged run.
        assert!(snapshot.segment_count() >= 2);
    };
    check(&store.snapshot());
    drop(store);
    check(&Store::open(dir.path()).unwrap().snapshot());
}
