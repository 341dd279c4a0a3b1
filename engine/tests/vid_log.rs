//! The vid log (the master's catalog on disk), run against a real directory
//! and against the in-memory one: reopening, torn appends, damage, and the
//! bytes of a log written by an earlier bitfold.

use std::sync::Arc;

use bitfold_engine::StoreError;

#[macro_use]
mod backends;
mod common;
use bitfold_engine::store::{Directory, MemoryDirectory, VID_LOG_NAME, VidLog};
use common::Rng;

/// Where a test's log lives; the same test bodies run on both.
trait Backend {
    fn open(&self) -> Result<(VidLog, Vec<u64>), StoreError>;
    fn read(&self) -> Vec<u8>;
    fn write(&self, bytes: &[u8]);
    fn path(&self) -> String;
}

struct Disk(tempfile::TempDir);

impl Backend for Disk {
    fn open(&self) -> Result<(VidLog, Vec<u64>), StoreError> {
        VidLog::open(self.0.path())
    }
    fn read(&self) -> Vec<u8> {
        std::fs::read(self.0.path().join(VID_LOG_NAME)).unwrap()
    }
    fn write(&self, bytes: &[u8]) {
        std::fs::write(self.0.path().join(VID_LOG_NAME), bytes).unwrap()
    }
    fn path(&self) -> String {
        self.0.path().join(VID_LOG_NAME).display().to_string()
    }
}

struct Memory(Arc<MemoryDirectory>);

impl Backend for Memory {
    fn open(&self) -> Result<(VidLog, Vec<u64>), StoreError> {
        VidLog::with_directory(self.0.clone())
    }
    fn read(&self) -> Vec<u8> {
        self.0.read(VID_LOG_NAME).unwrap().to_vec()
    }
    fn write(&self, bytes: &[u8]) {
        let mut file = self.0.create(VID_LOG_NAME).unwrap();
        file.write_all(bytes).unwrap();
        file.commit().unwrap();
    }
    fn path(&self) -> String {
        self.0.path(VID_LOG_NAME).display().to_string()
    }
}

fn vids(backend: &dyn Backend) -> Vec<u64> {
    backend.open().unwrap().1
}

/// A log written by the catalog of an earlier bitfold: vids 1 and 2 in one
/// import, then 3 in another.
const WRITTEN_BEFORE: &[u8] = &[
    0x42, 0x46, 0x43, 0x41, 0x54, 0x4c, 0x47, 0x31, 0x02, 0x00, 0x00, 0x00, 0xc9, 0x0b, 0xa2, 0x66,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xb4, 0x4e, 0x1d, 0xdf, 0xee, 0x12, 0x45, 0x36, 0x01, 0x00, 0x00, 0x00, 0x08, 0x57, 0xd6, 0x96,
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x57, 0x01, 0x30, 0x15, 0x74, 0xf6, 0x7a, 0xe9,
];

fn survives_reopening(backend: &dyn Backend) {
    let (mut log, held) = backend.open().unwrap();
    assert!(held.is_empty());
    log.append(&[5, 1, u64::MAX]).unwrap();
    log.append(&[]).unwrap();
    log.append(&[7]).unwrap();
    drop(log);
    assert_eq!(vids(backend), [5, 1, u64::MAX, 7]);
}

fn random_appends_read_back_in_order(backend: &dyn Backend) {
    let mut rng = Rng(7);
    let mut all = Vec::new();
    let (mut log, _) = backend.open().unwrap();
    for _ in 0..20 {
        let batch: Vec<u64> = (0..rng.below(50)).map(|_| rng.next_u64()).collect();
        log.append(&batch).unwrap();
        all.extend(batch);
    }
    drop(log);
    assert_eq!(vids(backend), all);
}

fn reads_and_extends_what_an_earlier_bitfold_wrote(backend: &dyn Backend) {
    backend.write(WRITTEN_BEFORE);
    let (mut log, held) = backend.open().unwrap();
    assert_eq!(held, [1, 2, 3]);
    assert_eq!(backend.read(), WRITTEN_BEFORE);
    log.append(&[4]).unwrap();
    drop(log);
    assert_eq!(vids(backend), [1, 2, 3, 4]);
}

fn writes_the_bytes_an_earlier_bitfold_wrote(backend: &dyn Backend) {
    let (mut log, _) = backend.open().unwrap();
    log.append(&[1, 2]).unwrap();
    log.append(&[3]).unwrap();
    assert_eq!(backend.read(), WRITTEN_BEFORE);
}

fn a_torn_last_record_is_dropped_and_appends_continue(backend: &dyn Backend) {
    let (mut log, _) = backend.open().unwrap();
    log.append(&[1, 2]).unwrap();
    let whole = backend.read().len();
    log.append(&[3, 4, 5]).unwrap();
    drop(log);
    let bytes = backend.read();
    for cut in [whole + 1, whole + 7, whole + 12, bytes.len() - 1] {
        backend.write(&bytes[..cut]);
        assert_eq!(vids(backend), [1, 2], "cut at {cut}");
        assert_eq!(backend.read().len(), whole, "cut at {cut}");
    }
    // A crash that extended the file with zeros.
    let mut zeros = bytes[..whole].to_vec();
    zeros.extend([0; 40]);
    backend.write(&zeros);
    let (mut log, _) = backend.open().unwrap();
    log.append(&[9]).unwrap();
    drop(log);
    assert_eq!(vids(backend), [1, 2, 9]);
}

fn damage_before_the_end_is_refused_naming_the_file(backend: &dyn Backend) {
    let (mut log, _) = backend.open().unwrap();
    log.append(&[1, 2]).unwrap();
    log.append(&[3]).unwrap();
    drop(log);
    let good = backend.read();
    for (at, what) in [
        (17, "a record fails its checksum"),
        (9, "a record header fails"),
    ] {
        let mut bytes = good.clone();
        bytes[at] ^= 0x40;
        backend.write(&bytes);
        let message = backend.open().unwrap_err().to_string();
        assert!(message.contains(&backend.path()), "{message}");
        assert!(
            message.contains("corrupt: at byte 8") && message.contains(what),
            "{message}"
        );
    }
    backend.write(b"something else entirely");
    let message = backend.open().unwrap_err().to_string();
    assert!(message.contains("bad magic"), "{message}");
}

fn a_torn_creation_starts_empty(backend: &dyn Backend) {
    backend.write(&WRITTEN_BEFORE[..3]);
    let (mut log, held) = backend.open().unwrap();
    assert!(held.is_empty());
    log.append(&[4]).unwrap();
    drop(log);
    assert_eq!(vids(backend), [4]);
}

fn removes_replay_in_order_with_appends(backend: &dyn Backend) {
    let (mut log, _) = backend.open().unwrap();
    log.append(&[1, 2, 3, 4]).unwrap();
    log.remove(&[2, 4, 99]).unwrap();
    log.append(&[4, 5]).unwrap();
    log.remove(&[]).unwrap();
    log.remove(&[5]).unwrap();
    drop(log);
    assert_eq!(vids(backend), [1, 3, 4]);
}

/// Random appends and removes against a naive replay: the live vids in the
/// order of their latest append.
fn random_removes_match_a_replay(backend: &dyn Backend) {
    let mut rng = Rng(11);
    let mut live: Vec<u64> = Vec::new();
    let (mut log, _) = backend.open().unwrap();
    for _ in 0..40 {
        let batch: Vec<u64> = (0..rng.below(8)).map(|_| rng.below(30)).collect();
        if rng.below(3) == 0 {
            log.remove(&batch).unwrap();
            live.retain(|vid| !batch.contains(vid));
        } else {
            log.append(&batch).unwrap();
            live.extend(&batch);
        }
    }
    drop(log);
    assert_eq!(vids(backend), live);
}

fn a_torn_remove_is_dropped(backend: &dyn Backend) {
    let (mut log, _) = backend.open().unwrap();
    log.append(&[1, 2]).unwrap();
    let whole = backend.read().len();
    log.remove(&[1]).unwrap();
    drop(log);
    let bytes = backend.read();
    backend.write(&bytes[..bytes.len() - 1]);
    assert_eq!(vids(backend), [1, 2]);
    assert_eq!(backend.read().len(), whole);
}

on_both_backends!(
    super::Disk, super::Memory;
    removes_replay_in_order_with_appends,
    random_removes_match_a_replay,
    a_torn_remove_is_dropped,
    survives_reopening,
    random_appends_read_back_in_order,
    reads_and_extends_what_an_earlier_bitfold_wrote,
    writes_the_bytes_an_earlier_bitfold_wrote,
    a_torn_last_record_is_dropped_and_appends_continue,
    damage_before_the_end_is_refused_naming_the_file,
    a_torn_creation_starts_empty,
);

#[test]
fn a_directory_holds_one_open_log() {
    let dir = tempfile::tempdir().unwrap();
    let _log = VidLog::open(dir.path()).unwrap();
    let err = VidLog::open(dir.path()).expect_err("opened twice");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
}
