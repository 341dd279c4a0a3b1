use std::sync::Arc;

use bitfold_engine::store::{Directory, MemoryDirectory, VID_LOG_NAME, VidLog};
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

/// Store opening: `data` is a list of files (records: a name byte, a `u32` length, the bytes) put in a
/// `MemoryDirectory`. Opening the store never panics, and if it opens, every
/// read works: each vid's parts, the cover of all of them and of the one
/// run spanning them (whose first missing vid is the first gap), the
/// vector count.
/// The catalog log in the same directory opens or is refused, and once open
/// it keeps what is appended to it.
pub fn store(data: &[u8]) {
    let dir = Arc::new(MemoryDirectory::new());
    for (name, bytes) in files(data) {
        let mut file = dir.create(name).expect("a memory file can be created");
        file.write_all(bytes).expect("a memory file can be written");
        file.commit().expect("a memory file can be committed");
    }
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

/// Cuts `data` into files: each record is a name byte (an index into
/// [`NAMES`], modulo), a little-endian `u32` length, and that many bytes
/// (fewer at the end of the input). A name given twice keeps the last, so
/// only the last record of each name is returned (an input of thousands of
/// tiny records makes at most one file per name).
fn files(mut data: &[u8]) -> impl Iterator<Item = (&'static str, &[u8])> {
    let mut files = [None; NAMES.len()];
    while let [name, rest @ ..] = data {
        let Some((len, rest)) = rest.split_first_chunk::<4>() else {
            break;
        };
        let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
        files[usize::from(*name) % NAMES.len()] = Some(&rest[..len]);
        data = &rest[len..];
    }
    NAMES
        .into_iter()
        .zip(files)
        .filter_map(|(name, bytes)| Some((name, bytes?)))
}
