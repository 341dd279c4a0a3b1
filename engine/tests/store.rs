//! The store's behaviour, run against a real directory and against the
//! in-memory one: round trips against a `BTreeSet` oracle, unions across
//! imports, reopening, merging, snapshots, and damaged files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use bitfold_engine::store::{CoverStats, Directory, MERGE_FACTOR, MemoryDirectory};
use bitfold_engine::{ImportStats, Snapshot, Store, StoreError, VectorBuf, VectorPart};

/// Where a test's store lives; the same test bodies run on both.
trait Backend {
    fn open(&self) -> Result<Store, StoreError>;
    fn files(&self) -> Vec<String>;
    fn read(&self, name: &str) -> Vec<u8>;
    fn write(&self, name: &str, bytes: &[u8]);
    fn remove(&self, name: &str);
}

struct Disk(tempfile::TempDir);

impl Backend for Disk {
    fn open(&self) -> Result<Store, StoreError> {
        Store::open(self.0.path())
    }
    fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.0.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.0.path().join(name)).unwrap()
    }
    fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.0.path().join(name), bytes).unwrap()
    }
    fn remove(&self, name: &str) {
        std::fs::remove_file(self.0.path().join(name)).unwrap()
    }
}

struct Memory(Arc<MemoryDirectory>);

impl Backend for Memory {
    fn open(&self) -> Result<Store, StoreError> {
        Store::with_directory(self.0.clone())
    }
    fn files(&self) -> Vec<String> {
        let mut names = self.0.list().unwrap();
        names.sort();
        names
    }
    fn read(&self, name: &str) -> Vec<u8> {
        self.0.read(name).unwrap().to_vec()
    }
    fn write(&self, name: &str, bytes: &[u8]) {
        let mut file = self.0.create(name).unwrap();
        file.write_all(bytes).unwrap();
        file.commit().unwrap();
    }
    fn remove(&self, name: &str) {
        self.0.delete(name).unwrap()
    }
}

#[macro_use]
mod backends;
mod common;
use common::Rng;

/// Test vectors.
trait RandomBits {
    fn bits(&mut self) -> Vec<u32>;
}

impl RandomBits for Rng {
    /// Bits of one of several shapes: a few scattered, a dense run, both,
    /// or the extremes of the position space.
    fn bits(&mut self) -> Vec<u32> {
        let mut bits = Vec::new();
        match self.below(4) {
            0 => bits.extend((0..1 + self.below(40)).map(|_| self.next_u64() as u32)),
            1 => {
                let start = self.below(1 << 22) as u32;
                let len = 1 + self.below(150_000) as u32;
                bits.extend((start..start + len).step_by(1 + self.below(3) as usize));
            }
            2 => {
                let key = self.below(64) as u32;
                bits.extend((0..600).map(|i| (key << 16) | (i * 97 % 65536)));
                bits.extend((0..5).map(|_| self.next_u64() as u32));
            }
            _ => bits.extend([0, u32::MAX, 65535, 65536]),
        }
        bits
    }
}

type Oracle = BTreeMap<u64, BTreeSet<u32>>;

fn bits_of(snapshot: &Snapshot, vid: u64) -> BTreeSet<u32> {
    snapshot.parts(vid).flat_map(|p| p.bits()).collect()
}

fn assert_holds(store: &Store, oracle: &Oracle) {
    let snapshot = store.snapshot();
    assert_eq!(
        snapshot.vids().collect::<Vec<_>>(),
        oracle.keys().copied().collect::<Vec<_>>()
    );
    assert_eq!(snapshot.vector_count(), oracle.len() as u64);
    for (&vid, bits) in oracle {
        assert!(snapshot.contains(vid));
        assert_eq!(&bits_of(&snapshot, vid), bits, "vector {vid}");
    }
}

/// Imports a random batch (vids drawn from `vids`, repeats likely) and
/// records it in the oracle.
fn import_random(store: &Store, oracle: &mut Oracle, rng: &mut Rng, vids: u64) -> ImportStats {
    let batch: Vec<(u64, VectorBuf)> = (0..1 + rng.below(12))
        .map(|_| (rng.below(vids), VectorBuf::from_bits(rng.bits())))
        .collect();
    let parts: Vec<(u64, VectorPart<'_>)> = batch.iter().map(|(v, b)| (*v, b.as_part())).collect();
    let stats = store.import(&parts).unwrap();
    let distinct: BTreeSet<u64> = batch.iter().map(|(v, _)| *v).collect();
    assert_eq!(stats.vectors, distinct.len() as u64);
    for (vid, buf) in &batch {
        oracle.entry(*vid).or_default().extend(buf.as_part().bits());
    }
    stats
}

fn round_trip_matches_the_oracle(backend: &dyn Backend) {
    let store = backend.open().unwrap();
    let mut oracle = Oracle::new();
    let mut rng = Rng(1);
    for _ in 0..6 {
        import_random(&store, &mut oracle, &mut rng, 10);
        assert_holds(&store, &oracle);
    }
    // The extremes of the vid space.
    let v = VectorBuf::from_bits(vec![7]);
    store
        .import(&[(u64::MAX, v.as_part()), (0, v.as_part())])
        .unwrap();
    oracle.entry(u64::MAX).or_default().insert(7);
    oracle.entry(0).or_default().insert(7);
    assert_holds(&store, &oracle);
}

fn repeats_in_and_across_batches_are_unions(backend: &dyn Backend) {
    let store = backend.open().unwrap();
    let a = VectorBuf::from_bits((0..5000).collect());
    let b = VectorBuf::from_bits(vec![3, 70_000, u32::MAX]);
    let c = VectorBuf::from_bits((4000..9000).step_by(2).collect());
    store
        .import(&[(5, a.as_part()), (9, b.as_part()), (5, b.as_part())])
        .unwrap();
    store.import(&[(5, c.as_part())]).unwrap();
    let expected: BTreeSet<u32> = (0..5000)
        .chain((4000..9000).step_by(2))
        .chain([70_000, u32::MAX])
        .collect();
    let snapshot = store.snapshot();
    assert_eq!(bits_of(&snapshot, 5), expected);
    assert_eq!(snapshot.parts(5).count(), 2);
    assert_eq!(bits_of(&snapshot, 9), BTreeSet::from([3, 70_000, u32::MAX]));
    // Importing the same thing again changes nothing a reader sees.
    store.import(&[(5, c.as_part())]).unwrap();
    assert_eq!(bits_of(&store.snapshot(), 5), expected);
}

fn empty_vectors_create_nothing(backend: &dyn Backend) {
    let store = backend.open().unwrap();
    let mut zero = VectorBuf::new();
    zero.push_dense(4, &[0; 1024]).unwrap();
    let stats = store
        .import(&[(1, VectorBuf::new().as_part()), (2, zero.as_part())])
        .unwrap();
    assert_eq!(stats.vectors, 0);
    assert_eq!(stats.bytes, 0);
    let snapshot = store.snapshot();
    assert_eq!(snapshot.vector_count(), 0);
    assert!(!snapshot.contains(1) && !snapshot.contains(2));
    assert_eq!(snapshot.parts(2).count(), 0);
    assert_eq!(snapshot.segment_count(), 0);
}

fn reopening_finds_everything(backend: &dyn Backend) {
    let mut oracle = Oracle::new();
    let mut rng = Rng(2);
    for _ in 0..3 {
        let store = backend.open().unwrap();
        assert_holds(&store, &oracle);
        for _ in 0..3 {
            import_random(&store, &mut oracle, &mut rng, 20);
        }
    }
    assert_holds(&backend.open().unwrap(), &oracle);
}

fn merging_keeps_every_bit_and_bounds_the_file_count(backend: &dyn Backend) {
    let store = backend.open().unwrap();
    let mut oracle = Oracle::new();
    let mut rng = Rng(3);
    let mut merged = 0;
    for i in 0..3 * MERGE_FACTOR {
        merged += import_random(&store, &mut oracle, &mut rng, 30).merged_segments;
        assert!(
            store.snapshot().segment_count() < MERGE_FACTOR,
            "import {i}"
        );
    }
    assert_eq!(merged, 3 * MERGE_FACTOR, "every import was merged once");
    assert_holds(&store, &oracle);
    let segments = backend
        .files()
        .into_iter()
        .filter(|n| n.ends_with(".bfseg"))
        .count();
    assert_eq!(segments, store.snapshot().segment_count());
    drop(store);
    assert_holds(&backend.open().unwrap(), &oracle);
}

fn a_snapshot_outlives_the_files_merged_away(backend: &dyn Backend) {
    let store = backend.open().unwrap();
    let mut oracle = Oracle::new();
    let mut rng = Rng(4);
    for _ in 0..3 {
        import_random(&store, &mut oracle, &mut rng, 8);
    }
    let old = store.snapshot();
    let old_oracle = oracle.clone();
    let mut merged = 0;
    for _ in 0..MERGE_FACTOR {
        let v = VectorBuf::from_bits(rng.bits());
        merged += store.import(&[(3, v.as_part())]).unwrap().merged_segments;
        oracle.entry(3).or_default().extend(v.as_part().bits());
    }
    assert!(merged >= MERGE_FACTOR, "the imports merged segments");
    for (&vid, bits) in &old_oracle {
        assert_eq!(&bits_of(&old, vid), bits, "old snapshot, vector {vid}");
    }
    assert_holds(&store, &oracle);
}

fn large_vectors_stream_through_merges(backend: &dyn Backend) {
    let store = backend.open().unwrap();
    // 300 dense containers each; overlapping, so the merge really unions words.
    let a = VectorBuf::from_bits((0..300u32 << 16).step_by(3).collect());
    let b = VectorBuf::from_bits((100u32 << 16..400u32 << 16).step_by(5).collect());
    store.import(&[(1, a.as_part())]).unwrap();
    for i in 1..MERGE_FACTOR {
        let part = if i % 2 == 0 { a.as_part() } else { b.as_part() };
        store.import(&[(1, part)]).unwrap();
    }
    let snapshot = store.snapshot();
    assert_eq!(snapshot.parts(1).count(), 1, "merged into one part");
    let expected: BTreeSet<u32> = (0..300u32 << 16)
        .step_by(3)
        .chain((100u32 << 16..400u32 << 16).step_by(5))
        .collect();
    assert_eq!(bits_of(&snapshot, 1), expected);
    let part = snapshot.parts(1).next().unwrap();
    assert_eq!(part.dense_keys().len(), 400);
    assert_eq!(part.dense_words().as_ptr() as usize % 64, 0);
}

fn store_files(backend: &dyn Backend) -> (String, String) {
    let store = backend.open().unwrap();
    let v = VectorBuf::from_bits((0..3000).chain([1 << 30]).collect());
    store.import(&[(42, v.as_part())]).unwrap();
    drop(store);
    let files = backend.files();
    let segment = files.iter().find(|n| n.ends_with(".bfseg")).unwrap();
    (segment.clone(), "MANIFEST".to_owned())
}

fn assert_refused(backend: &dyn Backend, name: &str, what: &str) {
    let err = backend.open().expect_err("a damaged store was opened");
    let message = err.to_string();
    assert!(message.contains(name), "{message:?} does not name {name}");
    assert!(message.contains(what), "{message:?} does not say {what:?}");
    assert!(
        message.contains("restore"),
        "{message:?} does not say what to do"
    );
}

fn a_flipped_byte_is_refused(backend: &dyn Backend) {
    let (segment, manifest) = store_files(backend);
    for name in [&segment, &manifest] {
        let original = backend.read(name);
        // Anywhere before the 32-byte footer.
        for at in [0, (original.len() - 32) / 2, original.len() - 33] {
            let mut bytes = original.clone();
            bytes[at] ^= 0x10;
            backend.write(name, &bytes);
            assert_refused(backend, name, "checksum mismatch");
        }
        backend.write(name, &original);
        assert!(backend.open().is_ok());
    }
}

fn a_truncated_file_is_refused(backend: &dyn Backend) {
    let (segment, manifest) = store_files(backend);
    for name in [&segment, &manifest] {
        let original = backend.read(name);
        for len in [0, 1, original.len() / 2, original.len() - 1] {
            backend.write(name, &original[..len]);
            assert_refused(backend, name, "truncated");
        }
        backend.write(name, &original);
    }
    assert!(backend.open().is_ok());
}

fn missing_files_are_named(backend: &dyn Backend) {
    let (segment, manifest) = store_files(backend);
    let bytes = backend.read(&segment);
    backend.remove(&segment);
    assert_refused(backend, &segment, "missing");
    backend.write(&segment, &bytes);
    backend.remove(&manifest);
    assert_refused(backend, &manifest, "missing");
}

fn leftovers_of_interrupted_writes_are_removed(backend: &dyn Backend) {
    let (segment, _) = store_files(backend);
    let bytes = backend.read(&segment);
    let stray = "seg-00000000000000ff.bfseg";
    backend.write(stray, &bytes);
    backend.write("seg-0000000000000100.bfseg.tmp", b"half");
    backend.write("MANIFEST.tmp", b"half");
    backend.write("notes.txt", b"the user's own file");
    let store = backend.open().unwrap();
    let files = backend.files();
    assert!(
        !files.iter().any(|n| n == stray || n.ends_with(".tmp")),
        "{files:?}"
    );
    assert!(files.iter().any(|n| n == "notes.txt"));
    assert!(files.contains(&segment));
    assert_eq!(store.snapshot().vids().collect::<Vec<_>>(), [42]);
}

/// A store killed while it wrote its very first manifest left only the
/// staged `MANIFEST.tmp`: the next open writes a manifest (over the staged
/// file, on disk) and opens.
fn a_first_manifest_cut_short_is_written_again(backend: &dyn Backend) {
    backend.write("MANIFEST.tmp", b"half");
    let store = backend.open().unwrap();
    let files = backend.files();
    assert!(files.iter().any(|n| n == "MANIFEST"), "{files:?}");
    assert!(!files.iter().any(|n| n.ends_with(".tmp")), "{files:?}");
    assert_eq!(store.snapshot().vids().count(), 0);
}

fn byte_size_counts_the_live_files(backend: &dyn Backend) {
    let store = backend.open().unwrap();
    let mut rng = Rng(5);
    let mut oracle = Oracle::new();
    for _ in 0..3 {
        import_random(&store, &mut oracle, &mut rng, 5);
    }
    let on_disk: u64 = backend
        .files()
        .iter()
        .filter(|n| n.ends_with(".bfseg"))
        .map(|n| backend.read(n).len() as u64)
        .sum();
    assert_eq!(store.snapshot().byte_size(), on_disk);
}

on_both_backends!(
    super::Disk, super::Memory;
    round_trip_matches_the_oracle,
    repeats_in_and_across_batches_are_unions,
    empty_vectors_create_nothing,
    reopening_finds_everything,
    merging_keeps_every_bit_and_bounds_the_file_count,
    a_snapshot_outlives_the_files_merged_away,
    large_vectors_stream_through_merges,
    a_flipped_byte_is_refused,
    a_truncated_file_is_refused,
    missing_files_are_named,
    leftovers_of_interrupted_writes_are_removed,
    a_first_manifest_cut_short_is_written_again,
    byte_size_counts_the_live_files,
);

#[test]
fn a_directory_is_used_by_one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let err = Store::open(dir.path()).expect_err("opened twice");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("in use by another bitfold process")
    );
    drop(store);
    assert!(Store::open(dir.path()).is_ok());
}

#[test]
fn readers_see_whole_imports_in_order() {
    let store = Arc::new(Store::in_memory());
    let writer = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            for batch in 0..40u64 {
                let marker = VectorBuf::from_bits(vec![batch as u32]);
                let shared = VectorBuf::from_bits(vec![1000 + batch as u32]);
                store
                    .import(&[(batch, marker.as_part()), (u64::MAX, shared.as_part())])
                    .unwrap();
            }
        })
    };
    loop {
        let snapshot = store.snapshot();
        let markers: Vec<u64> = snapshot.vids().filter(|&v| v != u64::MAX).collect();
        // Batches become visible whole and in order: markers 0..k, and the
        // shared vector holds exactly those batches' bits.
        let k = markers.len() as u64;
        assert_eq!(markers, (0..k).collect::<Vec<_>>());
        let shared: Vec<u32> = bits_of(&snapshot, u64::MAX).into_iter().collect();
        assert_eq!(shared, (1000..1000 + k as u32).collect::<Vec<_>>());
        if k == 40 {
            break;
        }
    }
    writer.join().unwrap();
}

/// Opens a copy of the committed store in `tests/fixtures/{name}` (opening
/// may remove files, which must not happen to the fixture).
fn open_fixture(name: &str) -> (tempfile::TempDir, Store) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    (dir, store)
}

/// A store written by format version 1 (one `Store::import` per vector of
/// `version_1_vectors`, in order), committed so that later versions of
/// bitfold are checked to still read it.
#[test]
fn a_version_1_store_still_opens() {
    let (_dir, store) = open_fixture("store-v1");
    assert_holds(&store, &version_1_vectors());
    assert_eq!(store.snapshot().segment_count(), 4);
}

fn version_1_vectors() -> Oracle {
    let mut oracle = Oracle::new();
    oracle.insert(0, BTreeSet::from([0, 1, u32::MAX]));
    oracle.insert(7, (0..2000).map(|i| i * 3).collect());
    oracle.insert(u64::MAX, (5 << 16..6 << 16).step_by(2).collect());
    oracle.insert(7 + (1 << 40), (0..300).map(|i| i * 65536 + 11).collect());
    oracle
}

/// A store written by format version 2, the first with range aggregates:
/// two `Store::import`s, `version_2_vectors` with vid 1's first bits and
/// vid 2 left out, then those; committed so that later versions of bitfold
/// are checked to still read it, aggregates included.
#[test]
fn a_version_2_store_still_opens() {
    let (_dir, store) = open_fixture("store-v2");
    let oracle = version_2_vectors();
    assert_holds(&store, &oracle);
    let snapshot = store.snapshot();
    assert_eq!(snapshot.segment_count(), 2);
    // The first segment's aggregate of vids 0..256 (it holds 0, 1 and 33),
    // its level 1 in version 2, read as the 256-vid level, and the second
    // segment's part of vid 1.
    let stats = covered_exactly(&snapshot, &oracle, &[0, 1, 33]);
    assert_eq!(stats.aggregates, [0, 0, 1, 0]);
    assert_eq!(stats.vectors, 1);
}

/// A store written by format version 3, the first with updates: an import
/// of vids 0, 1, 2, 33 and 40 with `version_2_vectors`' bits (vid 1 without
/// bits 1 and 2^31, 40 holding bit 4) and u64::MAX holding bit 9; an update
/// clearing all of vid 0, deleting vid 2, replacing vid 33 by bit 7 and
/// clearing bits 0 and 3 from vid 1 (a segment with `base`, `deleted` and
/// `keep` records and rebuilt aggregates); then an import of bit 5 into
/// vid 2. Committed so that later versions of bitfold are checked to still
/// read it.
#[test]
fn a_version_3_store_still_opens() {
    let (_dir, store) = open_fixture("store-v3");
    let mut oracle = version_2_vectors();
    oracle.insert(0, BTreeSet::new());
    let one = oracle.get_mut(&1).unwrap();
    for bit in [0, 3, 1, 1 << 31] {
        one.remove(&bit);
    }
    oracle.insert(2, BTreeSet::from([5]));
    oracle.insert(33, BTreeSet::from([7]));
    oracle.insert(40, BTreeSet::from([4]));
    oracle.remove(&(u64::MAX - 1));
    oracle.insert(u64::MAX, BTreeSet::from([9]));
    assert_holds(&store, &oracle);
    let snapshot = store.snapshot();
    assert_eq!(snapshot.segment_count(), 3);
    // No aggregate is small enough next to vid 1 to be written. Vids 1 and
    // 33 are read from the update's `base` records, 2 from the last import,
    // 40 (a `keep` record in the update) from the first import, and the
    // emptied vid 0 adds nothing.
    let stats = covered_exactly(&snapshot, &oracle, &[0, 1, 2, 33, 40]);
    assert_eq!(stats.aggregates, [0, 0, 0, 0]);
    assert_eq!(stats.vectors, 4);
}

/// A store written by format version 4, the first with 4-vid aggregates:
/// one `Store::import` of `version_4_vectors`; committed so that later
/// versions of bitfold are checked to still read it, aggregates included.
#[test]
fn a_version_4_store_still_opens() {
    let (_dir, store) = open_fixture("store-v4");
    let oracle = version_4_vectors();
    assert_holds(&store, &oracle);
    let snapshot = store.snapshot();
    // Vids 4 to 7 are one 4-vid aggregate; 0 to 7, every vid the segment
    // holds in its 16-vid block, one 16-vid aggregate; 1 to 7 the 4-vid
    // aggregate of 4 to 7 and three vectors.
    for (asked, aggregates, vectors) in [
        (4..8, [1, 0, 0, 0], 0),
        (0..8, [0, 1, 0, 0], 0),
        (1..8, [1, 0, 0, 0], 3),
    ] {
        let asked: Vec<u64> = asked.collect();
        let stats = covered_exactly(&snapshot, &oracle, &asked);
        assert_eq!(stats.aggregates, aggregates, "{asked:?}");
        assert_eq!(stats.vectors, vectors, "{asked:?}");
    }
}

/// Vids 0 to 7, each with a bit of its own and a dense container of 2,000
/// bits, a third of which it shares with each other vid.
fn version_4_vectors() -> Oracle {
    (0..8u32)
        .map(|vid| {
            let mut bits: BTreeSet<u32> = (0..2000).map(|i| 65536 + 3 * i + vid % 3).collect();
            bits.insert(vid);
            (u64::from(vid), bits)
        })
        .collect()
}

/// Checks that the cover of `asked` is the union of their vectors in
/// `oracle`; returns what it read.
fn covered_exactly(snapshot: &Snapshot, oracle: &Oracle, asked: &[u64]) -> CoverStats {
    let cover = snapshot.cover(asked);
    let covered: BTreeSet<u32> = cover.parts.iter().flat_map(|p| p.bits()).collect();
    let expected: BTreeSet<u32> = asked.iter().flat_map(|v| oracle[v].clone()).collect();
    assert_eq!(covered, expected, "cover of {asked:?}");
    cover.stats
}

fn version_2_vectors() -> Oracle {
    let mut oracle = Oracle::new();
    oracle.insert(0, BTreeSet::from([0, 1, u32::MAX]));
    let mut one: BTreeSet<u32> = (0..2000).map(|i| i * 3).collect();
    one.extend([1, 1 << 31]);
    oracle.insert(1, one);
    oracle.insert(2, BTreeSet::from([2]));
    oracle.insert(33, (5 << 16..6 << 16).step_by(2).collect());
    oracle.insert(u64::MAX - 1, BTreeSet::from([9]));
    oracle.insert(u64::MAX, (0..300).map(|i| i * 65536 + 11).collect());
    oracle
}

/// A segment of many megabytes (the store asks the kernel to start writing
/// it to disk every few MiB while it is built) reads back whole after the
/// store is closed and reopened.
#[test]
fn a_segment_of_many_megabytes_reads_back_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    // 40 vectors of 40 dense containers (8 KiB each): a segment over 12 MiB.
    let mut oracle = Oracle::new();
    let vectors: Vec<(u64, VectorBuf)> = (0..40u64)
        .map(|vid| {
            let bits: Vec<u32> = (0..40u32 << 16).skip(vid as usize).step_by(7).collect();
            oracle.insert(vid, bits.iter().copied().collect());
            (vid, VectorBuf::from_bits(bits))
        })
        .collect();
    let batch: Vec<(u64, VectorPart<'_>)> =
        vectors.iter().map(|(v, b)| (*v, b.as_part())).collect();
    let stats = Store::open(dir.path()).unwrap().import(&batch).unwrap();
    assert!(stats.bytes > 12 << 20, "only {} bytes", stats.bytes);
    let store = Store::open(dir.path()).unwrap();
    assert_holds(&store, &oracle);
}

/// A store keeps the id it was created with across restarts (a store from
/// before identities gets one when first opened, and keeps it); another
/// directory, or this one wiped, has another.
#[test]
fn a_store_keeps_its_identity_and_a_wiped_one_has_another() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap().identity();
    assert_ne!(first.store, 0);
    assert_eq!(Store::open(dir.path()).unwrap().identity(), first);
    let other = tempfile::tempdir().unwrap();
    assert_ne!(
        Store::open(other.path()).unwrap().identity().store,
        first.store
    );
    for name in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::remove_file(name.unwrap().path()).unwrap();
    }
    assert_ne!(
        Store::open(dir.path()).unwrap().identity().store,
        first.store
    );
    let (fixture, old) = open_fixture("store-v2");
    let upgraded = old.identity();
    drop(old);
    assert_ne!(upgraded.store, 0);
    assert_eq!(Store::open(fixture.path()).unwrap().identity(), upgraded);
}

/// Writes stamped by a master are applied once, in their order: one sent
/// again or late (not after the last applied) and one of an older master
/// epoch change nothing; the last write applied survives a restart, also
/// when it changed no vector.
#[test]
fn stamped_writes_are_fenced_and_their_stamp_is_durable() {
    use bitfold_engine::Update;
    use bitfold_engine::store::{Fenced, Stamp};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let at = |write, piece| Stamp { write, piece };
    let bits = |b: &[u32]| VectorBuf::from_bits(b.to_vec());
    let one = bits(&[1]);
    assert!(matches!(
        store.import_at(2, at(5, 0), &[(7, one.as_part())]).unwrap(),
        Fenced::Applied(_)
    ));
    let two = bits(&[2]);
    // The same write again, an earlier piece, an earlier write: not applied.
    for stamp in [at(5, 0), at(4, 9)] {
        assert_eq!(
            store.import_at(2, stamp, &[(7, two.as_part())]).unwrap(),
            Fenced::AlreadyApplied(at(5, 0))
        );
    }
    let clear = [Update::Clear(7, one.as_part())];
    assert_eq!(
        store.update_at(1, at(6, 0), &clear).unwrap(),
        Fenced::OlderEpoch(2)
    );
    let held = |store: &Store| -> Vec<u32> {
        let bits: BTreeSet<u32> = store.snapshot().parts(7).flat_map(|p| p.bits()).collect();
        bits.into_iter().collect()
    };
    assert_eq!(held(&store), [1]);
    // A later piece of the same write, then a write that changes nothing.
    assert!(matches!(
        store.import_at(2, at(5, 1), &[(7, two.as_part())]).unwrap(),
        Fenced::Applied(_)
    ));
    assert!(matches!(
        store.update_at(3, at(8, 0), &[Update::Delete(99)]).unwrap(),
        Fenced::Applied(_)
    ));
    let identity = store.identity();
    assert_eq!((identity.epoch, identity.applied), (3, at(8, 0)));
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.identity(), identity);
    assert_eq!(held(&store), [1, 2]);
    assert_eq!(
        store.update_at(3, at(7, 0), &clear).unwrap(),
        Fenced::AlreadyApplied(at(8, 0))
    );
    assert_eq!(held(&store), [1, 2]);
}

/// A staged import is read by nothing until it is committed, in the order
/// of the stamps; a staged import the fence refuses, or one discarded, is
/// removed; one never committed is gone when the store opens again.
#[test]
fn a_staged_import_is_applied_only_when_committed() {
    use bitfold_engine::store::{Fenced, Stamp};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let at = |write| Stamp { write, piece: 0 };
    let bits = |b: &[u32]| VectorBuf::from_bits(b.to_vec());
    let (one, two, three) = (bits(&[1]), bits(&[2]), bits(&[3]));
    let files = || std::fs::read_dir(dir.path()).unwrap().count();
    let before = files();
    let first = store.stage(&[(7, one.as_part())]).unwrap();
    let second = store.stage(&[(6, two.as_part())]).unwrap();
    let late = store.stage(&[(7, two.as_part())]).unwrap();
    let never = store.stage(&[(8, three.as_part())]).unwrap();
    assert_eq!(files(), before + 4, "staged durably, as files");
    assert!(!store.snapshot().contains(7), "nothing staged is read");
    // Two pieces of one write: applied together.
    assert!(matches!(
        store.commit_at(1, at(4), vec![first, second]).unwrap(),
        Fenced::Applied(stats) if stats.vectors == 2
    ));
    // Staged earlier than a write applied since: refused, and removed.
    assert_eq!(
        store.commit_at(1, at(3), vec![late]).unwrap(),
        Fenced::AlreadyApplied(at(4))
    );
    let held: Vec<u32> = store.snapshot().parts(7).flat_map(|p| p.bits()).collect();
    assert_eq!(held, [1]);
    assert!(store.snapshot().contains(6));
    assert_eq!(store.identity().applied, at(4));
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert!(
        !store.snapshot().contains(8),
        "a batch never committed is not read"
    );
    assert_eq!(files(), before + 2, "and its file is gone: {never:?}");
    let staged = store.stage(&[(9, one.as_part())]).unwrap();
    store.discard(staged);
    assert_eq!(files(), before + 2);
}
