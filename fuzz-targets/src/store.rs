use crate::files::directory;

use bitfold_engine::store::{VID_LOG_NAME, VidLog};
use bitfold_engine::{Store, VectorPart, VidRun};

/// The names a fuzzed directory's files get, by the first byte of their record.
const NAMES: [&str; 6] = [
    "MANIFEST",
    "seg-0000000000000001.bfseg",
    "seg-0000000000000002.bfseg",
    "seg-0000000000000003.bfseg",
    VID_LOG_NAME,
    "MANIFEST.tmp",
];

/// Store opening: `data` is a list of files (`files.rs`: records of a
/// name byte, a `u32` length, the bytes) put in a `MemoryDirectory`; a file
/// whose name byte has its top bit set is resealed first (its checksums
/// made to match it), so that mutations reach the checks behind them. Opening the store never panics, and if it opens, every
/// read works: each vid's parts, the cover of all of them and of the one
/// run spanning them (whose first missing vid is the first gap), the
/// vector count.
/// The catalog log in the same directory opens or is refused, and once open
/// it keeps what is appended to it.
pub fn store(data: &[u8]) {
    let dir = directory(data, &NAMES);
    if let Ok(store) = Store::with_directory(dir.clone()) {
        let snapshot = store.snapshot();
        let vids: Vec<u64> = snapshot.vids().collect();
        assert!(
            vids.windows(2).all(|w| w[0] < w[1]),
            "vids ascend, once each"
        );
        assert_eq!(snapshot.vector_count(), vids.len() as u64);
        for &vid in &vids {
            assert!(snapshot.contains(vid));
            snapshot.parts(vid).for_each(|p| walk(&p));
        }
        snapshot.cover(&vids).parts.iter().for_each(walk);
        if let (Some(&first), Some(&last)) = (vids.first(), vids.last()) {
            // One run over every held vid and the gaps between them.
            let span = [VidRun { first, last }];
            let gap = vids.windows(2).find(|w| w[1] != w[0] + 1).map(|w| w[0] + 1);
            assert_eq!(snapshot.first_missing_in(&span), gap);
            snapshot.cover_runs(&span).parts.iter().for_each(walk);
        }
    }
    if let Ok((mut log, held)) = VidLog::with_directory(dir.clone()) {
        log.append(&[7, 3])
            .expect("a memory log can be appended to");
        drop(log);
        let (_, again) = VidLog::with_directory(dir).expect("a log just written reopens");
        assert_eq!(again, [&held[..], &[7, 3]].concat());
    }
}

/// Checks that `part` holds the invariants its bit walk relies on (keys and
/// positions strictly ascending, lengths that agree), and reads every word
/// of it: per container, not per bit, since a few bytes of a run can hold
/// millions of bits.
fn walk(part: &VectorPart<'_>) {
    let checked = VectorPart::new(
        part.dense_keys(),
        part.dense_words(),
        part.sparse_keys(),
        part.sparse_ends(),
        part.sparse_values(),
    );
    assert!(
        checked.is_ok(),
        "a part the store reads is well formed: {checked:?}"
    );
    assert_eq!(part.is_empty(), part.cardinality() == 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::RESEAL;

    /// A log of three records, [1, 2], remove [1], [9], each with both
    /// checksums zero, as the record of name 4 (the log) of an input.
    fn unsealed_log(name: u8) -> Vec<u8> {
        let mut log = b"BFCATLG1".to_vec();
        for (count, vids) in [(2u32, &[1u64, 2][..]), (1 | 1 << 31, &[1]), (1, &[9])] {
            log.extend(count.to_le_bytes());
            log.extend(0u32.to_le_bytes());
            vids.iter().for_each(|v| log.extend(v.to_le_bytes()));
            log.extend(0u64.to_le_bytes());
        }
        let mut input = vec![name];
        input.extend((log.len() as u32).to_le_bytes());
        input.extend(log);
        input
    }

    #[test]
    fn a_file_is_resealed_only_when_asked() {
        let refused = VidLog::with_directory(directory(&unsealed_log(4), &NAMES)).unwrap_err();
        assert!(refused.to_string().contains("checksum"), "{refused}");
        let (_, vids) =
            VidLog::with_directory(directory(&unsealed_log(4 | RESEAL), &NAMES)).unwrap();
        assert_eq!(vids, [2, 9]);
    }
}
