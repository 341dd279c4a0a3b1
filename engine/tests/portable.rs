//! The portable Roaring codec against roaring-rs, against files written by
//! pyroaring (CRoaring), and against malformed input.

use std::collections::BTreeSet;
use std::path::Path;

use bitfold_engine::{VectorBuf, VectorPart, portable};
use proptest::prelude::*;
use roaring::RoaringBitmap;

fn bits(v: &VectorBuf) -> Vec<u32> {
    v.as_part().bits().collect()
}

fn serialize(parts: &[VectorPart<'_>]) -> Vec<u8> {
    let mut out = vec![0; portable::serialized_size(parts)];
    portable::write(parts, &mut out);
    out
}

fn roaring_bytes(bitmap: &RoaringBitmap) -> Vec<u8> {
    let mut out = Vec::new();
    bitmap.serialize_into(&mut out).unwrap();
    out
}

/// Bit sets with dense runs, sparse scatter and the extremes, to hit array,
/// bitmap and run containers and the first and last keys.
fn bit_sets() -> impl Strategy<Value = Vec<u32>> {
    let scatter = proptest::collection::vec(any::<u32>(), 0..300);
    let ranges = proptest::collection::vec((0u32..1 << 20, 1u32..20_000, 1u32..4), 0..4);
    let edges = proptest::collection::vec(
        prop_oneof![Just(0u32), Just(u32::MAX), Just(65535), Just(65536)],
        0..3,
    );
    (scatter, ranges, edges).prop_map(|(scatter, ranges, edges)| {
        let mut bits: Vec<u32> = scatter.into_iter().chain(edges).collect();
        for (start, len, step) in ranges {
            bits.extend((start..start.saturating_add(len)).step_by(step as usize));
        }
        bits
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn written_bytes_are_what_roaring_rs_writes(bits in bit_sets()) {
        let ours = VectorBuf::from_bits(bits.clone());
        let theirs: RoaringBitmap = bits.into_iter().collect();
        let bytes = serialize(&[ours.as_part()]);
        prop_assert_eq!(bytes.len(), theirs.serialized_size());
        prop_assert_eq!(&bytes, &roaring_bytes(&theirs));
        prop_assert_eq!(RoaringBitmap::deserialize_from(&bytes[..]).unwrap(), theirs);
    }

    #[test]
    fn roaring_rs_output_reads_back_with_or_without_runs(set in bit_sets(), runs in any::<bool>()) {
        let mut theirs: RoaringBitmap = set.iter().copied().collect();
        if runs {
            theirs.optimize();
        }
        let read = portable::read(&roaring_bytes(&theirs)).unwrap();
        prop_assert_eq!(bits(&read), theirs.iter().collect::<Vec<_>>());
    }

    #[test]
    fn key_disjoint_parts_write_as_their_union(bits in bit_sets(), cut in any::<u16>()) {
        let whole = VectorBuf::from_bits(bits.clone());
        let (low, high): (Vec<u32>, Vec<u32>) = bits.into_iter().partition(|&b| (b >> 16) < u32::from(cut));
        let (low, high) = (VectorBuf::from_bits(low), VectorBuf::from_bits(high));
        prop_assert_eq!(
            serialize(&[low.as_part(), VectorPart::EMPTY, high.as_part()]),
            serialize(&[whole.as_part()])
        );
    }

    #[test]
    fn damaged_bytes_never_panic(bits in bit_sets(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let mut theirs: RoaringBitmap = bits.into_iter().collect();
        theirs.optimize();
        let mut bytes = roaring_bytes(&theirs);
        for (at, value) in flips {
            let at = at % bytes.len();
            bytes[at] = value;
        }
        // Either an error or a valid vector; never a panic.
        if let Ok(v) = portable::read(&bytes) {
            prop_assert!(VectorPart::new(
                v.as_part().dense_keys(),
                v.as_part().dense_words(),
                v.as_part().sparse_keys(),
                v.as_part().sparse_ends(),
                v.as_part().sparse_values(),
            ).is_ok());
        }
    }
}

/// The sets `make_fixtures.py` serialises, built the same way.
fn fixture_bits(name: &str) -> BTreeSet<u32> {
    let range = |r: std::ops::Range<u32>| r.collect::<BTreeSet<u32>>();
    match name {
        "arrays" => [0, 1, 2, 65535, 65536, 1 << 20, u32::MAX].into(),
        "bitmap" => (0..100_000).step_by(3).collect(),
        "runs" => {
            let mut s = range(10..70_000);
            s.extend(range(1 << 31..(1 << 31) + 5000));
            s.extend([u32::MAX, 5 << 16]);
            s
        }
        "runs_no_offsets" => {
            let mut s = range(100..200);
            s.extend(range(1000..5000));
            s.insert(1 << 20);
            s
        }
        "mixed" => {
            let mut s: BTreeSet<u32> = (0..65536).step_by(2).collect();
            s.extend(range(65536 + 100..65536 + 300));
            s.extend([(3 << 16) | 7, (3 << 16) | 9000]);
            s
        }
        "empty" => BTreeSet::new(),
        other => panic!("no fixture {other}"),
    }
}

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/portable")
        .join(format!("{name}.bin"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

const FIXTURES: [&str; 6] = [
    "arrays",
    "bitmap",
    "runs",
    "runs_no_offsets",
    "mixed",
    "empty",
];

#[test]
fn pyroaring_files_read_as_the_sets_they_hold() {
    for name in FIXTURES {
        let read = portable::read(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected = fixture_bits(name);
        assert_eq!(
            read.as_part().bits().collect::<BTreeSet<_>>(),
            expected,
            "{name}"
        );
        assert_eq!(read.as_part().cardinality(), expected.len() as u64);
    }
}

#[test]
fn without_runs_our_bytes_equal_croaring_bytes() {
    for name in ["arrays", "bitmap", "empty"] {
        let bytes = fixture(name);
        let read = portable::read(&bytes).unwrap();
        assert_eq!(serialize(&[read.as_part()]), bytes, "{name}");
    }
}

#[test]
fn every_truncation_of_a_file_is_refused() {
    for name in ["arrays", "runs", "runs_no_offsets", "mixed"] {
        let bytes = fixture(name);
        for len in 0..bytes.len() {
            assert!(
                portable::read(&bytes[..len]).is_err(),
                "{name} cut to {len} bytes was accepted"
            );
        }
    }
}

fn problem(bytes: &[u8]) -> String {
    portable::read(bytes)
        .expect_err("malformed input was accepted")
        .to_string()
}

fn u32_le(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

#[test]
fn bad_cookies_are_refused() {
    assert!(problem(&[0, 0, 0, 0, 0, 0, 0, 0]).contains("unknown cookie"));
    assert!(problem(b"").contains("the cookie"));
    let mut bytes = fixture("arrays");
    bytes[0] ^= 0x80;
    assert!(problem(&bytes).contains("unknown cookie"));
}

#[test]
fn huge_declared_sizes_are_refused_before_allocating() {
    for count in [u32::MAX, 1 << 17, 65537] {
        let mut bytes = u32_le(portable::COOKIE_NO_RUNS).to_vec();
        bytes.extend(u32_le(count));
        assert!(problem(&bytes).contains("containers declared"), "{count}");
    }
    // 65536 containers declared with the headers missing.
    let mut bytes = u32_le(portable::COOKIE_NO_RUNS).to_vec();
    bytes.extend(u32_le(65536));
    assert!(problem(&bytes).contains("the container descriptions"));
    // The run cookie's largest count, with nothing after it.
    let cookie = u32::from(portable::COOKIE_RUNS) | 0xffff << 16;
    assert!(problem(&u32_le(cookie)).contains("run container flags"));
}

/// An array-only bitmap with the given (key, values) containers.
fn arrays(containers: &[(u16, &[u16])]) -> Vec<u8> {
    let mut bytes = u32_le(portable::COOKIE_NO_RUNS).to_vec();
    bytes.extend(u32_le(containers.len() as u32));
    for (key, values) in containers {
        bytes.extend(key.to_le_bytes());
        bytes.extend((values.len() as u16 - 1).to_le_bytes());
    }
    let mut offset = 8 + 8 * containers.len();
    for (_, values) in containers {
        bytes.extend(u32_le(offset as u32));
        offset += 2 * values.len();
    }
    for (_, values) in containers {
        for v in *values {
            bytes.extend(v.to_le_bytes());
        }
    }
    bytes
}

#[test]
fn structural_damage_is_named() {
    assert!(portable::read(&arrays(&[(1, &[5]), (2, &[6])])).is_ok());
    assert!(problem(&arrays(&[(2, &[5]), (1, &[6])])).contains("keys must strictly ascend"));
    assert!(problem(&arrays(&[(2, &[5]), (2, &[6])])).contains("keys must strictly ascend"));
    assert!(problem(&arrays(&[(1, &[6, 5])])).contains("not strictly ascending"));
    assert!(problem(&arrays(&[(1, &[5, 5])])).contains("not strictly ascending"));
    let mut trailing = arrays(&[(1, &[5])]);
    trailing.push(0);
    assert!(problem(&trailing).contains("1 bytes follow the last container"));
    let mut bad_offset = arrays(&[(1, &[5]), (2, &[6])]);
    bad_offset[20] += 2; // the second container's offset
    assert!(problem(&bad_offset).contains("offset header"));
}

#[test]
fn a_bitmap_container_must_hold_its_declared_cardinality() {
    let mut bytes = fixture("bitmap");
    // Key 0's bitmap starts at byte 24; clearing a set bit breaks the count.
    bytes[24] &= !1;
    assert!(problem(&bytes).contains("holds 21845 bits but its header declares 21846"));
}

/// A run-cookie bitmap of one run container holding `runs`.
fn runs(cardinality: u16, runs: &[(u16, u16)]) -> Vec<u8> {
    let mut bytes = u32_le(u32::from(portable::COOKIE_RUNS)).to_vec();
    bytes.push(1); // container 0 is a run container
    bytes.extend(0u16.to_le_bytes());
    bytes.extend((cardinality - 1).to_le_bytes());
    bytes.extend((runs.len() as u16).to_le_bytes());
    for (start, length) in runs {
        bytes.extend(start.to_le_bytes());
        bytes.extend(length.to_le_bytes());
    }
    bytes
}

#[test]
fn runs_are_checked() {
    let ok = portable::read(&runs(7, &[(1, 2), (10, 3)])).unwrap();
    assert_eq!(bits(&ok), [1, 2, 3, 10, 11, 12, 13]);
    assert_eq!(
        bits(&portable::read(&runs(1000, &[(0, 999)])).unwrap()),
        (0..1000).collect::<Vec<_>>()
    );
    assert!(problem(&runs(8, &[(1, 2), (3, 3)])).contains("not after the previous run"));
    assert!(problem(&runs(7, &[(10, 3), (1, 2)])).contains("not after the previous run"));
    // Touching runs (1-3, then 4-6) are refused, as the `roaring` crate does.
    assert!(problem(&runs(7, &[(1, 2), (4, 2)])).contains("not after the previous run"));
    assert!(problem(&runs(2, &[(65535, 1)])).contains("goes past position 65535"));
    assert!(problem(&runs(9, &[(1, 2), (10, 3)])).contains("declares 9"));
    assert!(problem(&runs(1, &[])).contains("holds 0 bits"));
}
