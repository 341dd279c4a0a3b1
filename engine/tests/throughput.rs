//! Throughput of the bulk-load path, measured against a baseline in the
//! same run (the machine is shared and noisy, so only ratios mean much).
//! Ignored by default; run in release mode:
//!
//! ```text
//! cargo test --release -p bitfold-engine --test throughput -- --ignored --nocapture --test-threads=1
//! ```
//!
//! Each check asserts that the work was done right, never how fast.

use std::convert::Infallible;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::time::Instant;

use bitfold_engine::import::{self, Format};
use bitfold_engine::{Store, VectorBuf, VectorPart};

const MB: f64 = 1e6;

/// Writes about `bytes` of pairs: 10,000 vids, bits below 2^24; returns the pair count.
fn pairs_file(path: &Path, bytes: u64) -> u64 {
    let mut out = BufWriter::new(File::create(path).unwrap());
    let (mut written, mut pairs, mut x) = (0u64, 0u64, 0x2545_f491_4f6c_dd1du64);
    while written < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let line = format!("{},{}\n", x % 10_000, (x >> 20) % (1 << 24));
        out.write_all(line.as_bytes()).unwrap();
        written += line.len() as u64;
        pairs += 1;
    }
    out.flush().unwrap();
    pairs
}

/// The baseline: read the file in 1 MiB chunks and count its lines.
fn count_lines(path: &Path) -> u64 {
    let mut file = File::open(path).unwrap();
    let mut buf = vec![0; 1 << 20];
    let mut lines = 0;
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            return lines;
        }
        lines += memchr::memchr_iter(b'\n', &buf[..n]).count() as u64;
    }
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / MB / seconds
}

#[test]
#[ignore = "measurement; run in release mode with --ignored --nocapture"]
fn pairs_parsing_and_store_import() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pairs.csv");
    let pairs = pairs_file(&path, 100_000_000);
    let size = path.metadata().unwrap().len();
    let paths = [path.clone()];

    let t = Instant::now();
    assert_eq!(count_lines(&path), pairs);
    let baseline = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let summary = import::validate(&paths, Format::Pairs, &|_| {}).unwrap();
    let validate = t.elapsed().as_secs_f64();
    assert_eq!(summary.bits, pairs);

    let t = Instant::now();
    let mut batched = 0;
    import::read_batches(&paths, Format::Pairs, 1 << 24, &|_| {}, |batch| {
        batched += batch
            .iter()
            .map(|(_, v)| v.as_part().cardinality())
            .sum::<u64>();
        Ok::<(), Infallible>(())
    })
    .unwrap();
    let batches = t.elapsed().as_secs_f64();
    assert!(batched > 0 && batched <= pairs);

    let store_dir = dir.path().join("store");
    let store = Store::open(&store_dir).unwrap();
    let t = Instant::now();
    let mut stored = 0;
    import::read_batches(&paths, Format::Pairs, 1 << 24, &|_| {}, |batch| {
        let parts: Vec<(u64, VectorPart<'_>)> =
            batch.iter().map(|(v, b)| (*v, b.as_part())).collect();
        stored += store.import(&parts).map(|s| s.bytes)?;
        Ok::<(), bitfold_engine::StoreError>(())
    })
    .unwrap();
    let import = t.elapsed().as_secs_f64();
    assert_eq!(store.snapshot().vector_count(), 10_000);

    println!("pairs file: {:.1} MB, {pairs} lines", size as f64 / MB);
    println!(
        "baseline read + count lines: {:.0} MB/s",
        rate(size, baseline)
    );
    println!(
        "validate: {:.0} MB/s ({:.2}x the baseline's time)",
        rate(size, validate),
        validate / baseline
    );
    println!(
        "read_batches (parse + sort into vectors): {:.0} MB/s ({:.2}x)",
        rate(size, batches),
        batches / baseline
    );
    println!(
        "parse + store import (fsynced): {:.0} MB/s of input, {:.1} MB of segments written",
        rate(size, import),
        stored as f64 / MB
    );
}

#[test]
#[ignore = "measurement; run in release mode with --ignored --nocapture"]
fn writing_and_opening_a_big_store() {
    let dir = tempfile::tempdir().unwrap();
    // 7 imports (one short of a merge) of 8 dense vectors of 16 MiB and
    // 125,000 small sparse ones each.
    let dense = VectorBuf::from_bits((0..2048u32 << 16).step_by(3).collect());
    let small: Vec<VectorBuf> = (0..64)
        .map(|i| VectorBuf::from_bits((0..20).map(|b| b * 1000 + i).collect()))
        .collect();

    let store = Store::open(dir.path()).unwrap();
    let t = Instant::now();
    let mut written = 0;
    for batch in 0..7u64 {
        let parts: Vec<(u64, VectorPart<'_>)> = (0..8)
            .map(|i| (batch * 8 + i, dense.as_part()))
            .chain((0..125_000).map(|i| {
                (
                    1 << 32 | (batch * 125_000 + i),
                    small[i as usize % 64].as_part(),
                )
            }))
            .collect();
        written += store.import(&parts).unwrap().bytes;
    }
    let write = t.elapsed().as_secs_f64();
    let size = store.snapshot().byte_size();
    drop(store);

    // Baseline: write and fsync the same number of bytes as plain files.
    let t = Instant::now();
    let chunk = vec![7u8; 64 << 20];
    let mut file = File::create(dir.path().join("baseline")).unwrap();
    for _ in 0..written.div_ceil(chunk.len() as u64) {
        file.write_all(&chunk).unwrap();
    }
    file.sync_all().unwrap();
    let baseline_write = t.elapsed().as_secs_f64();
    std::fs::remove_file(dir.path().join("baseline")).unwrap();

    let t = Instant::now();
    let store = Store::open(dir.path()).unwrap();
    let open = t.elapsed().as_secs_f64();
    let snapshot = store.snapshot();
    assert_eq!(snapshot.vector_count(), 56 + 875_000);
    assert_eq!(snapshot.parts(5).next().unwrap(), dense.as_part());

    // Baseline for opening: read every byte of the store once.
    let t = Instant::now();
    let mut buf = vec![0; 1 << 20];
    let mut read = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let mut file = File::open(entry.unwrap().path()).unwrap();
        while let Ok(n @ 1..) = file.read(&mut buf) {
            read += n as u64;
        }
    }
    let baseline_read = t.elapsed().as_secs_f64();
    assert!(read >= size);

    println!(
        "store import: {:.0} MB/s ({:.1} MB in {:.2} s; plain write + fsync {:.0} MB/s)",
        rate(written, write),
        written as f64 / MB,
        write,
        rate(written, baseline_write)
    );
    println!(
        "open {:.1} MB, {} segments, {} vectors: {:.3} s ({:.2}x the time to read every byte)",
        size as f64 / MB,
        snapshot.segment_count(),
        snapshot.vector_count(),
        open,
        open / baseline_read
    );
}
