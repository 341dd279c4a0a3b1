//! Import parsing: valid input yields exactly the oracle's vectors in
//! bounded batches; every kind of bad entry is reported with its file and
//! line (pairs) or file name (roaring).

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::{Path, PathBuf};

use bitfold_engine::import::{self, Format, ImportError, ReadError, Summary};
use bitfold_engine::{VectorBuf, portable};

type Oracle = BTreeMap<u64, BTreeSet<u32>>;

/// Reads everything, checking each batch's shape; returns the union and
/// the number of batches.
fn read_all(paths: &[PathBuf], format: Format, batch_bits: usize) -> (Oracle, usize) {
    let mut got = Oracle::new();
    let mut batches = 0;
    import::read_batches(paths, format, batch_bits, &|_| {}, |batch| {
        batches += 1;
        assert!(!batch.is_empty());
        assert!(batch.windows(2).all(|w| w[0].0 <= w[1].0), "vids ascend");
        let bits: u64 = batch.iter().map(|(_, v)| v.as_part().cardinality()).sum();
        assert!(
            bits <= batch_bits as u64 || batch.len() == 1,
            "a batch of {bits} bits exceeds {batch_bits}"
        );
        for (vid, v) in batch {
            assert!(!v.as_part().is_empty(), "vector {vid} is empty");
            got.entry(*vid).or_default().extend(v.as_part().bits());
        }
        Ok::<(), Infallible>(())
    })
    .unwrap();
    (got, batches)
}

fn validate(paths: &[PathBuf], format: Format) -> Result<Summary, ImportError> {
    import::validate(paths, format, &|_| {})
}

mod common;
use common::Rng;

/// Writes a pairs file of `lines` random pairs in every accepted layout.
fn pairs_file(path: &Path, rng: &mut Rng, lines: usize, oracle: &mut Oracle) -> u64 {
    let mut text = String::from("# vid,bit\n");
    let mut pairs = 0;
    for i in 0..lines {
        let vid = match rng.below(10) {
            0 => u64::MAX - rng.below(3),
            1..=6 => rng.below(50),
            _ => rng.next_u64(),
        };
        let bit = match rng.below(4) {
            0 => rng.next_u64() as u32,
            1 => u32::MAX - rng.below(2) as u32,
            _ => rng.below(300_000) as u32,
        };
        let line = match i % 7 {
            0 => format!("{vid},{bit}\n"),
            1 => format!(" {vid} ,\t{bit}\r\n"),
            2 => format!("\t{vid},{bit}  \n"),
            3 => format!("{vid},{bit}\n\n   \n"),
            4 => format!("  # {vid},{bit} is a comment\n{vid},{bit}\n"),
            5 => format!("{vid:0>25},{bit:0>12}\n"),
            _ => format!("{vid},{bit}\r\n"),
        };
        text.push_str(&line);
        oracle.entry(vid).or_default().insert(bit);
        pairs += 1;
    }
    // The last line without its newline.
    text.push_str("3,3");
    oracle.entry(3).or_default().insert(3);
    std::fs::write(path, text).unwrap();
    pairs + 1
}

#[test]
fn valid_pairs_yield_exactly_the_oracle_in_bounded_batches() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(7);
    let mut oracle = Oracle::new();
    let paths: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("{i}.csv")))
        .collect();
    let mut pairs = 0;
    for (path, lines) in paths.iter().zip([50_000, 10, 120_000]) {
        pairs += pairs_file(path, &mut rng, lines, &mut oracle);
    }
    let summary = validate(&paths, Format::Pairs).unwrap();
    assert_eq!(summary.bits, pairs);
    assert_eq!(summary.files, 3);
    let on_disk: u64 = paths.iter().map(|p| p.metadata().unwrap().len()).sum();
    assert_eq!(summary.bytes, on_disk);
    for batch_bits in [1000, 1 << 30] {
        let (got, batches) = read_all(&paths, Format::Pairs, batch_bits);
        assert_eq!(got, oracle);
        assert!(batches as u64 >= pairs / batch_bits as u64);
    }
}

#[test]
fn progress_adds_up_to_the_input_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.csv");
    pairs_file(&path, &mut Rng(1), 200_000, &mut Oracle::new());
    let paths = [path];
    let total = Cell::new(0);
    let summary = import::validate(&paths, Format::Pairs, &|n| total.set(total.get() + n)).unwrap();
    assert_eq!(total.get(), summary.bytes);
    total.set(0);
    import::read_batches(
        &paths,
        Format::Pairs,
        5000,
        &|n| total.set(total.get() + n),
        |_| Ok::<(), Infallible>(()),
    )
    .unwrap();
    assert_eq!(total.get(), summary.bytes);
}

#[test]
fn a_byte_order_mark_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bom.csv");
    std::fs::write(&path, b"\xEF\xBB\xBF5,6\r\n").unwrap();
    let (got, _) = read_all(&[path], Format::Pairs, 10);
    assert_eq!(got, Oracle::from([(5, BTreeSet::from([6]))]));
}

/// The error for a file of good lines with `bad` at line 17.
fn error_at_line_17(bad: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.csv");
    std::fs::write(&good, "1,1\n2,2\n").unwrap();
    let path = dir.path().join("x.csv");
    let mut text = String::from("# header\n\n");
    for i in 0..14 {
        text.push_str(&format!("{i},{i}\n"));
    }
    text.push_str(bad);
    text.push_str("\n5,5\n");
    std::fs::write(&path, text).unwrap();
    let paths = [good, path.clone()];
    let err = validate(&paths, Format::Pairs).expect_err("bad input was accepted");
    assert_eq!(err.path, path);
    assert_eq!(err.line, Some(17));
    // Reading stops at the same place.
    let read = import::read_batches(&paths, Format::Pairs, 1, &|_| {}, |_| {
        Ok::<(), Infallible>(())
    });
    match read {
        Err(ReadError::Input(e)) => assert_eq!(e.to_string(), err.to_string()),
        other => panic!("reading gave {other:?}"),
    }
    let message = err.to_string();
    let location = format!("{}:17: ", path.display());
    assert!(message.starts_with(&location), "{message}");
    message[location.len()..].to_owned()
}

#[test]
fn each_bad_pairs_line_is_reported_with_file_and_line() {
    let cases = [
        (
            "1,4294967296",
            "bit 4294967296 is out of range (bits are 0..=4294967295)",
        ),
        (
            "18446744073709551616,1",
            "vid 18446744073709551616 is out of range (vids are 0..=18446744073709551615)",
        ),
        (
            "-4,1",
            "vid -4 is negative (vids are 0..=18446744073709551615)",
        ),
        ("4,-1", "bit -1 is negative (bits are 0..=4294967295)"),
        ("four,1", "vid \"four\" is not a decimal number"),
        ("4,1.5", "bit \"1.5\" is not a decimal number"),
        ("4", "expected 2 fields \"vid,bit\", found 1"),
        ("4,1,2", "expected 2 fields \"vid,bit\", found 3"),
        ("4;1", "vid \"4;1\" is not a decimal number"),
        (",1", "the vid is empty (lines are \"vid,bit\")"),
        ("4,", "the bit is empty (lines are \"vid,bit\")"),
        (
            "4 1",
            "unexpected \"1\" after the vid (lines are \"vid,bit\")",
        ),
    ];
    for (line, expected) in cases {
        assert_eq!(error_at_line_17(line), expected, "line {line:?}");
    }
    let long = format!("1,{}1", " ".repeat(import::MAX_LINE));
    assert!(error_at_line_17(&long).contains("longer than"));
}

#[test]
fn line_numbers_stay_exact_across_read_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.csv");
    // About 3 MiB of lines, so the bad one lies several chunks in.
    let lines = 300_000;
    let mut text = String::new();
    for i in 0..lines {
        text.push_str(&format!("{},{}\n", i % 1000, i));
    }
    text.push_str("7,x\n");
    std::fs::write(&path, text).unwrap();
    let err = validate(&[path], Format::Pairs).unwrap_err();
    assert_eq!(err.line, Some(lines + 1));
}

#[test]
fn unreadable_and_wrong_kinds_of_paths_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.csv");
    let err = validate(std::slice::from_ref(&missing), Format::Pairs).unwrap_err();
    assert!(
        err.to_string().contains("missing.csv: cannot read"),
        "{err}"
    );
    let err = validate(&[dir.path().to_path_buf()], Format::Pairs).unwrap_err();
    assert!(err.to_string().contains("is a directory"), "{err}");
}

fn roaring_file(path: &Path, bits: &[u32]) {
    let v = VectorBuf::from_bits(bits.to_vec());
    let parts = [v.as_part()];
    let mut bytes = vec![0; portable::serialized_size(&parts)];
    portable::write(&parts, &mut bytes);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_roaring_directory_imports_its_vid_files_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    roaring_file(&d.join("3.roaring"), &[1, 2, 70_000]);
    roaring_file(&d.join("007.roaring"), &(0..5000).collect::<Vec<_>>());
    roaring_file(&d.join("18446744073709551615.roaring"), &[u32::MAX]);
    roaring_file(&d.join("9.roaring"), &[]);
    std::fs::write(d.join("README"), "not a bitmap").unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    let single = tempfile::tempdir().unwrap();
    let explicit = single.path().join("12.roaring");
    roaring_file(&explicit, &[12]);

    let paths = [d.to_path_buf(), explicit];
    let summary = validate(&paths, Format::Roaring).unwrap();
    assert_eq!(summary.files, 5);
    assert_eq!(summary.skipped, 2);
    assert_eq!(summary.bits, 3 + 5000 + 1 + 1);
    let (got, _) = read_all(&paths, Format::Roaring, 1 << 20);
    let expected = Oracle::from([
        (3, BTreeSet::from([1, 2, 70_000])),
        (7, (0..5000).collect()),
        (12, BTreeSet::from([12])),
        (u64::MAX, BTreeSet::from([u32::MAX])),
    ]);
    assert_eq!(got, expected);
}

#[test]
fn roaring_batches_respect_batch_bits() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = Oracle::new();
    for vid in 0..30u64 {
        let bits: Vec<u32> = (0..100 + vid as u32 * 10).map(|b| b * 7).collect();
        roaring_file(&dir.path().join(format!("{vid}.roaring")), &bits);
        expected.insert(vid, bits.into_iter().collect());
    }
    let paths = [dir.path().to_path_buf()];
    let (got, batches) = read_all(&paths, Format::Roaring, 1000);
    assert_eq!(got, expected);
    assert!(batches >= 7, "{batches} batches");
    // A file larger than batch_bits makes a batch of its own.
    let (got, batches) = read_all(&paths, Format::Roaring, 50);
    assert_eq!(got, expected);
    assert_eq!(batches, 30);
}

fn roaring_error(name: &str, bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    roaring_file(&dir.path().join("1.roaring"), &[1]);
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    // In a directory and given alone, the file is named.
    for paths in [vec![dir.path().to_path_buf()], vec![path.clone()]] {
        let err = validate(&paths, Format::Roaring).expect_err("bad input was accepted");
        assert_eq!(err.path, path, "{err}");
        assert_eq!(err.line, None);
    }
    validate(&[path], Format::Roaring).unwrap_err().to_string()
}

#[test]
fn bad_roaring_files_are_named() {
    let valid = {
        let v = VectorBuf::from_bits(vec![5]);
        let mut bytes = vec![0; portable::serialized_size(&[v.as_part()])];
        portable::write(&[v.as_part()], &mut bytes);
        bytes
    };
    let cases = [
        (
            "abc.roaring",
            &valid[..],
            "vid \"abc\" is not a decimal number",
        ),
        ("-5.roaring", &valid[..], "vid -5 is negative"),
        (
            "18446744073709551616.roaring",
            &valid[..],
            "vid 18446744073709551616 is out of range",
        ),
        (".roaring", &valid[..], "the vid is empty"),
        (
            "2.roaring",
            &valid[..valid.len() - 1],
            "not a valid portable roaring bitmap",
        ),
        ("3.roaring", b"hello, world", "unknown cookie"),
    ];
    for (name, bytes, expected) in cases {
        let message = roaring_error(name, bytes);
        assert!(message.contains(expected), "{name}: {message}");
        assert!(message.contains(name), "{name}: {message}");
    }
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("5.bin");
    std::fs::write(&other, &valid).unwrap();
    let err = validate(std::slice::from_ref(&other), Format::Roaring).unwrap_err();
    assert!(err.to_string().contains("must be <vid>.roaring"), "{err}");
}

#[test]
fn a_failing_sink_stops_the_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.csv");
    pairs_file(&path, &mut Rng(3), 10_000, &mut Oracle::new());
    let mut calls = 0;
    let result = import::read_batches(&[path], Format::Pairs, 100, &|_| {}, |_| {
        calls += 1;
        if calls == 3 { Err("disk full") } else { Ok(()) }
    });
    assert!(matches!(result, Err(ReadError::Sink("disk full"))));
    assert_eq!(calls, 3);
}
