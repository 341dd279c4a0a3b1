//! `Snapshot::cover`: the union of its parts is exactly the union of the
//! vectors asked for, whatever the imports, deletes, merges and reopenings before, on
//! a real directory and in memory; damaged aggregates are refused.
//!
//! The measurement (ignored by default) compares covering runs with reading
//! every vector of the run:
//!
//! ```text
//! cargo test --release -p bitfold-engine --test cover -- --ignored --nocapture --test-threads=1
//! ```

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use bitfold_engine::fold::UnionPlan;
use bitfold_engine::store::{AGGREGATE_LEVELS, Cover, Directory, MemoryDirectory, Update};
use bitfold_engine::{Snapshot, Store, StoreError, VectorBuf, VectorPart};
use proptest::prelude::*;

/// Where a test's store lives; the same test bodies run on both.
enum Backend {
    Memory(Arc<MemoryDirectory>),
    Disk(tempfile::TempDir),
}

impl Backend {
    /// Opens the store (the previous one must be dropped first).
    fn open(&self) -> Store {
        self.try_open().unwrap()
    }

    fn try_open(&self) -> Result<Store, StoreError> {
        match self {
            Backend::Memory(dir) => Store::with_directory(dir.clone()),
            Backend::Disk(dir) => Store::open(dir.path()),
        }
    }

    fn segments(&self) -> Vec<String> {
        let names: Vec<String> = match self {
            Backend::Memory(dir) => dir.list().unwrap(),
            Backend::Disk(dir) => std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect(),
        };
        names
            .into_iter()
            .filter(|n| n.ends_with(".bfseg"))
            .collect()
    }

    fn read(&self, name: &str) -> Vec<u8> {
        match self {
            Backend::Memory(dir) => dir.read(name).unwrap().to_vec(),
            Backend::Disk(dir) => std::fs::read(dir.path().join(name)).unwrap(),
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        match self {
            Backend::Memory(dir) => {
                let mut file = dir.create(name).unwrap();
                file.write_all(bytes).unwrap();
                file.commit().unwrap();
            }
            Backend::Disk(dir) => std::fs::write(dir.path().join(name), bytes).unwrap(),
        }
    }
}

fn on_both_backends(test: impl Fn(&Backend)) {
    test(&Backend::Memory(Arc::default()));
    test(&Backend::Disk(tempfile::tempdir().unwrap()));
}

fn bits_of<'p>(parts: impl IntoIterator<Item = VectorPart<'p>>) -> BTreeSet<u32> {
    parts.into_iter().flat_map(|p| p.bits()).collect()
}

/// Checks `cover(vids)` against the union of every part of every vid, and
/// that it never uses more parts, and `first_missing(vids)` against asking
/// `contains` of each vid; returns the cover.
fn assert_exact<'s>(snapshot: &'s Snapshot, vids: &[u64]) -> Cover<'s> {
    assert_eq!(
        snapshot.first_missing(vids),
        vids.iter().copied().find(|&v| !snapshot.contains(v)),
        "the first missing of {} vids from {:?}",
        vids.len(),
        vids.first()
    );
    let naive: Vec<VectorPart<'_>> = vids.iter().flat_map(|&v| snapshot.parts(v)).collect();
    let cover = snapshot.cover(vids);
    assert_eq!(
        bits_of(cover.parts.iter().copied()),
        bits_of(naive.iter().copied()),
        "cover of {} vids from {:?}",
        vids.len(),
        vids.first()
    );
    assert!(cover.parts.len() <= naive.len());
    let stats = cover.stats;
    let used = stats.aggregates.iter().sum::<u64>() + stats.vectors;
    assert_eq!(used, cover.parts.len() as u64);
    cover
}

/// Where the vids of a case live: near 0, near a random aligned spot, or
/// ending at `u64::MAX`.
const SPAN: u64 = 9000;

fn base() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        (1u64..1 << 40).prop_map(|b| b * 4096 - 37),
        Just(u64::MAX - (SPAN - 1)),
    ]
}

/// Offsets of a batch or a query: a dense run (maybe strided), a scatter,
/// or the ends of aggregate blocks (of 32 vids, and of the lowest level).
fn offsets() -> impl Strategy<Value = BTreeSet<u64>> {
    prop_oneof![
        (0..SPAN, 1u64..1200, 1u64..4).prop_map(|(start, len, step)| {
            (start..(start + len).min(SPAN))
                .step_by(step as usize)
                .collect()
        }),
        proptest::collection::btree_set(0..SPAN, 1..60),
        proptest::collection::btree_set(
            (0..SPAN / 32, prop_oneof![Just(0u64), Just(31)]).prop_map(|(b, e)| b * 32 + e),
            1..40,
        ),
        proptest::collection::btree_set(
            (0..SPAN / 4, prop_oneof![Just(0u64), Just(3)]).prop_map(|(b, e)| b * 4 + e),
            1..200,
        ),
    ]
}

/// The vector batch `batch` imports for the vid at `offset`: a bit only that
/// vid has (so a vid included by mistake shows), a bit of the batch, for
/// most vids a dense container (so that aggregates are worth writing), and
/// for some a bit at the far end of the position space (so that their
/// blocks' aggregates are too big to build in memory and are streamed from
/// the parts instead).
fn vector(offset: u64, batch: u32) -> VectorBuf {
    let mut bits = vec![offset as u32, 1 << 20 | batch];
    if !offset.is_multiple_of(5) {
        bits.extend((3 << 16..(3 << 16) + 5000).map(|b| b + offset as u32 % 64));
    }
    if offset % 53 == 3 {
        bits.push(u32::MAX - offset as u32);
    }
    VectorBuf::from_bits(bits)
}

fn import(store: &Store, base: u64, offsets: &BTreeSet<u64>, batch: u32) {
    let vectors: Vec<(u64, VectorBuf)> = offsets
        .iter()
        .map(|&o| (base + o, vector(o, batch)))
        .collect();
    let parts: Vec<(u64, VectorPart<'_>)> =
        vectors.iter().map(|(v, b)| (*v, b.as_part())).collect();
    store.import(&parts).unwrap();
}

fn vids(base: u64, offsets: &BTreeSet<u64>) -> Vec<u64> {
    offsets.iter().map(|&o| base + o).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_cover_is_the_union_of_the_vectors_asked_for(
        base in base(),
        batches in proptest::collection::vec(offsets(), 1..13),
        queries in proptest::collection::vec(offsets(), 1..6),
    ) {
        on_both_backends(|backend| {
            let store = backend.open();
            for (batch, offsets) in batches.iter().enumerate() {
                if batch % 4 == 3 {
                    // Deletes, written without rebuilding aggregates: older
                    // aggregates of their blocks must not be used.
                    let deletes: Vec<Update<'_>> =
                        vids(base, offsets).into_iter().map(Update::Delete).collect();
                    store.update(&deletes).unwrap();
                } else {
                    import(&store, base, offsets, batch as u32);
                }
                // Every import adds bits to vids older segments' aggregates
                // cover, every delete removes some, and either may merge.
                let snapshot = store.snapshot();
                for query in &queries {
                    assert_exact(&snapshot, &vids(base, query));
                }
            }
            drop(store);
            let store = backend.open();
            let snapshot = store.snapshot();
            let all: Vec<u64> = snapshot.vids().collect();
            assert_exact(&snapshot, &all);
            for query in &queries {
                assert_exact(&snapshot, &vids(base, query));
            }
        });
    }
}

#[test]
fn whole_blocks_are_read_as_one_aggregate() {
    on_both_backends(|backend| {
        let store = backend.open();
        let all: BTreeSet<u64> = (0..2 * 4096).collect();
        import(&store, 4096, &all, 0);
        let snapshot = store.snapshot();
        let run: Vec<u64> = (4096..3 * 4096).collect();
        let stats = assert_exact(&snapshot, &run).stats;
        assert_eq!(stats.aggregates, [0, 0, 0, 2]);
        assert_eq!(stats.vectors, 0);

        // One vid short of the first block: at each level below the top,
        // all but one of its blocks in the first block of the level above,
        // single vectors in the first lowest block, and the whole second
        // block.
        let [width, middle, wide, top] = AGGREGATE_LEVELS;
        let stats = assert_exact(&snapshot, &run[1..]).stats;
        assert_eq!(
            stats.aggregates,
            [middle / width - 1, wide / middle - 1, top / wide - 1, 1]
        );
        assert_eq!(stats.vectors, width - 1);

        // A block the run asks for only part of is not used.
        let holes: Vec<u64> = (4096..4096 + 64).filter(|v| v % width != 1).collect();
        let stats = assert_exact(&snapshot, &holes).stats;
        assert_eq!(stats.aggregates, [0, 0, 0, 0]);
        assert_eq!(stats.vectors, 64 - 64 / width);
        drop(store);

        // Another replica's vids between the held ones: the aggregate of a
        // block covers only this store's vids, so asking for them all
        // (held or not) still uses it.
        let store = backend.open();
        let run: Vec<u64> = (1 << 20..(1 << 20) + 256).collect();
        let held: BTreeSet<u64> = (0..256).step_by(3).collect();
        import(&store, 1 << 20, &held, 1);
        let stats = assert_exact(&store.snapshot(), &run).stats;
        assert_eq!(stats.aggregates, [0, 0, 1, 0]);
    });
}

/// The byte ranges of the aggregates' data and of the aggregate index in a
/// segment file, from its trailer (see the format in `segment/mod.rs`).
fn aggregate_areas(bytes: &[u8]) -> (usize, std::ops::Range<usize>) {
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    // The footer (32 bytes) follows the version 3 trailer (32 bytes).
    let trailer = bytes.len() - 32 - 32;
    let index = u64_at(trailer);
    let aggregates = index + 32 * u64_at(trailer + 8);
    assert!(u64_at(trailer + 16) > 0, "the segment has aggregates");
    let first_data = u64_at(aggregates + 8);
    (first_data, aggregates..trailer)
}

#[test]
fn a_damaged_aggregate_is_refused() {
    on_both_backends(|backend| {
        let store = backend.open();
        import(&store, 0, &(0..100).collect(), 0);
        drop(store);
        let [name] = &backend.segments()[..] else {
            panic!("one import writes one segment")
        };
        let original = backend.read(name);
        let (data, index) = aggregate_areas(&original);
        for at in [data, data + 100, index.start + 3, index.end - 1] {
            let mut bytes = original.clone();
            bytes[at] ^= 0x04;
            backend.write(name, &bytes);
            let Err(err) = backend.try_open() else {
                panic!("a damaged aggregate at byte {at} was accepted")
            };
            let message = err.to_string();
            assert!(message.contains(name.as_str()), "{message}");
            assert!(message.contains("checksum mismatch"), "{message}");
        }
        backend.write(name, &original);
        assert_exact(&backend.open().snapshot(), &(0..100).collect::<Vec<_>>());
    });
}

/// 2,000 vectors of 2^20 bits at `density` percent, each bit drawn
/// independently (a splitmix64 stream).
fn random_vectors(density: u64) -> Vec<VectorBuf> {
    let mut state = density;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..2000)
        .map(|_| {
            let bits: Vec<u32> = (0..1u32 << 20).filter(|_| next() % 100 < density).collect();
            VectorBuf::from_sorted_bits(&bits)
        })
        .collect()
}

/// Seconds per call of `f`, the best of a few rounds of enough calls.
fn seconds_per_call(mut f: impl FnMut()) -> f64 {
    let calls = 20;
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls {
                f();
            }
            t.elapsed().as_secs_f64() / calls as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// A cover's table cells: parts (aggregates per level + vectors) | MB.
fn described(cover: &Cover<'_>) -> String {
    format!(
        "{} ({:?} + {}) | {:.1}",
        cover.parts.len(),
        cover.stats.aggregates,
        cover.stats.vectors,
        cover.stats.bytes as f64 / 1e6
    )
}

/// Folds `parts` with the engine's union, as a handler does.
fn union_cardinality(parts: &[VectorPart<'_>]) -> u64 {
    UnionPlan::new(parts)
        .run(parts)
        .iter()
        .map(|v| v.as_part().cardinality())
        .sum()
}

/// Imports `vectors` (vid = index) in `batches` batches of consecutive vids.
fn import_in_batches(store: &Store, vectors: &[VectorBuf], batches: usize) {
    let per_batch = vectors.len() / batches;
    for (b, batch) in vectors.chunks(per_batch).enumerate() {
        let parts: Vec<(u64, VectorPart<'_>)> = batch
            .iter()
            .enumerate()
            .map(|(i, v)| ((b * per_batch + i) as u64, v.as_part()))
            .collect();
        store.import(&parts).unwrap();
    }
}

#[test]
#[ignore = "measurement; run in release mode with --ignored --nocapture"]
fn cover_against_reading_every_vector() {
    println!("levels {AGGREGATE_LEVELS:?}");
    println!(
        "| density | store | import ms | vectors MB | other MB | run | naive parts | naive MB | \
         naive ms | cover parts | cover MB | cover ms |"
    );
    println!("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for density in [50, 1] {
        let vectors = random_vectors(density);
        let data: u64 = vectors.iter().map(|v| v.as_part().byte_len()).sum();
        for (shape, batches) in [("1 segment", 1), ("5 segments", 5)] {
            // The best of 3 imports into a fresh store, each fsynced.
            let mut import = f64::INFINITY;
            let mut kept = None;
            for _ in 0..3 {
                let dir = tempfile::tempdir().unwrap();
                let store = Store::open(dir.path()).unwrap();
                let t = Instant::now();
                import_in_batches(&store, &vectors, batches);
                import = import.min(t.elapsed().as_secs_f64());
                kept = Some((dir, store));
            }
            let (_dir, store) = kept.unwrap();
            let snapshot = store.snapshot();
            let size = snapshot.byte_size();
            for (run, start, len) in [
                ("64 aligned", 512, 64),
                ("64 unaligned", 517, 64),
                ("1,024 aligned", 0, 1024),
                ("1,024 unaligned", 517, 1024),
            ] {
                let vids: Vec<u64> = (start..start + len).collect();
                let naive: Vec<VectorPart<'_>> =
                    vids.iter().flat_map(|&v| snapshot.parts(v)).collect();
                let cover = snapshot.cover(&vids);
                assert_eq!(union_cardinality(&naive), union_cardinality(&cover.parts));
                let naive_bytes: u64 = naive.iter().map(VectorPart::byte_len).sum();
                let naive_time = seconds_per_call(|| {
                    let naive: Vec<VectorPart<'_>> =
                        vids.iter().flat_map(|&v| snapshot.parts(v)).collect();
                    std::hint::black_box(union_cardinality(&naive));
                });
                let cover_time = seconds_per_call(|| {
                    let cover = snapshot.cover(&vids);
                    std::hint::black_box(union_cardinality(&cover.parts));
                });
                println!(
                    "| {density}% | {shape} | {:.0} | {:.1} | {:.1} | {run} | {} | {:.1} | {:.2} | \
                     {} | {:.2} |",
                    import * 1e3,
                    data as f64 / 1e6,
                    size.saturating_sub(data) as f64 / 1e6,
                    naive.len(),
                    naive_bytes as f64 / 1e6,
                    naive_time * 1e3,
                    described(&cover),
                    cover_time * 1e3,
                );
            }
        }
    }
}

/// Covers of runs over a store with an update pending (its segment holds
/// `base` and `deleted` records over an import's segment) against a store
/// holding the same vectors written fresh, which is what compaction leaves.
#[test]
#[ignore = "measurement; run in release mode with --ignored --nocapture"]
fn cover_with_pending_updates_against_compacted() {
    println!(
        "| density | update ms | run | pending parts | pending MB | pending ms | \
         compacted parts | compacted MB | compacted ms | pending ÷ compacted ms |"
    );
    println!("|---|---:|---|---|---:|---:|---|---:|---:|---:|");
    for density in [50, 1] {
        let vectors = random_vectors(density);
        let pending = Store::in_memory();
        import_in_batches(&pending, &vectors, 1);
        // 20 vectors (1%) lose 1,000 bits each and 10 are deleted, spread
        // over the vids.
        let cleared: Vec<VectorBuf> = (0..20)
            .map(|i| VectorBuf::from_bits((0..1000).map(|b| b * 1000 + i).collect()))
            .collect();
        let mut updates: Vec<Update<'_>> = cleared
            .iter()
            .enumerate()
            .map(|(i, bits)| Update::Clear(i as u64 * 100 + 7, bits.as_part()))
            .collect();
        updates.extend((0..10).map(|i| Update::Delete(i * 200 + 50)));
        let t = Instant::now();
        pending.update(&updates).unwrap();
        let update_time = t.elapsed().as_secs_f64();
        let snapshot = pending.snapshot();
        let compacted = Store::in_memory();
        let held: Vec<u64> = snapshot.vids().collect();
        let batch: Vec<(u64, VectorPart<'_>)> = held
            .iter()
            .flat_map(|&vid| snapshot.parts(vid).map(move |part| (vid, part)))
            .collect();
        compacted.import(&batch).unwrap();
        let fresh = compacted.snapshot();
        for (run, range) in [
            ("64 aligned", 512..576),
            ("1,024 aligned", 0..1024),
            ("1,024 unaligned", 517..1541),
            ("all 2,000", 0..2000),
        ] {
            let vids: Vec<u64> = held.iter().copied().filter(|v| range.contains(v)).collect();
            let (a, b) = (snapshot.cover(&vids), fresh.cover(&vids));
            assert_eq!(union_cardinality(&a.parts), union_cardinality(&b.parts));
            let time = |s: &Snapshot| {
                seconds_per_call(|| {
                    let cover = s.cover(&vids);
                    std::hint::black_box(union_cardinality(&cover.parts));
                })
            };
            let (pending_time, compacted_time) = (time(&snapshot), time(&fresh));
            println!(
                "| {density}% | {:.0} | {run} | {} | {:.2} | {} | {:.2} | {:.2} |",
                update_time * 1e3,
                described(&a),
                pending_time * 1e3,
                described(&b),
                compacted_time * 1e3,
                pending_time / compacted_time,
            );
        }
    }
}
