//! The vid log: a durable, append-only list of vids added and removed, the
//! master's catalog on disk (`catalog.log` in its data directory).
//!
//! ```text
//! file   := magic record*
//! magic  := "BFCATLG1"
//! record := count:u32 head:u32 vid:u64{count & 0x7fff_ffff} sum:u64   (little-endian)
//! ```
//!
//! A record adds its vids, or removes them if bit 31 of `count` is set
//! ([`VidLog::remove`]); opening replays the records in order. Logs written
//! before removes existed never set that bit and read as they always did.
//! `head` is the low half of the xxh3-64 of `count`'s bytes and `sum` the
//! xxh3-64 of everything before it in the record, so a record is either whole
//! and right or recognisably not. Records are only appended, and synced
//! before [`VidLog::append`] returns. On open, a damaged *last* record (a
//! crash in the middle of an append) is dropped and cut off the file; damage
//! anywhere before the end is refused with an error naming the file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use super::StoreError;
use super::footer::{u32_at, u64_at};
use super::storage::{AppendFile, Directory, MemoryDirectory, MmapDirectory};

/// The log's file name.
pub const VID_LOG_NAME: &str = "catalog.log";

const MAGIC: &[u8; 8] = b"BFCATLG1";

/// The most vids one record holds; longer appends are split.
const RECORD_MAX: usize = 1 << 20;

/// The bit of a record's count that makes it a remove record.
const REMOVE: u32 = 1 << 31;

/// An open vid log. Appends are serialised by `&mut self`; each is durable
/// when it returns.
pub struct VidLog {
    /// Kept so that a directory's lock lasts as long as the log.
    _dir: Arc<dyn Directory>,
    file: Box<dyn AppendFile>,
    path: PathBuf,
    /// Length of the file's valid content; appends go here.
    len: u64,
}

impl std::fmt::Debug for VidLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VidLog").field("path", &self.path).finish()
    }
}

impl VidLog {
    /// Opens (creating if missing) the log in directory `dir`, which stays
    /// locked against other processes while the log lives. Returns the log
    /// and the vids it holds: those appended, in the order appended, less
    /// each one removed after it was appended.
    pub fn open(dir: impl AsRef<Path>) -> Result<(VidLog, Vec<u64>), StoreError> {
        VidLog::with_directory(Arc::new(MmapDirectory::open(dir)?))
    }

    /// The same log held in memory (tests); nothing durable.
    pub fn in_memory() -> VidLog {
        VidLog::with_directory(Arc::new(MemoryDirectory::new()))
            .expect("an empty in-memory directory always opens")
            .0
    }

    /// Opens the log held in `dir`, dropping a torn last record and refusing
    /// earlier damage.
    pub fn with_directory(dir: Arc<dyn Directory>) -> Result<(VidLog, Vec<u64>), StoreError> {
        let path = dir.path(VID_LOG_NAME);
        let file = dir.open_append(VID_LOG_NAME)?;
        let bytes = dir.read(VID_LOG_NAME)?;
        let (vids, valid) = parse(&bytes).map_err(|(offset, problem)| {
            StoreError::corrupt(&path, format!("at byte {offset}: {problem}"))
        })?;
        let file_len = bytes.len() as u64;
        // The bytes may be a map of the file: let it go before cutting the file.
        drop(bytes);
        let mut log = VidLog {
            _dir: dir,
            file,
            path,
            len: valid,
        };
        if valid < MAGIC.len() as u64 {
            log.file.truncate(0)?;
            log.file.write_at(0, MAGIC)?;
            log.len = MAGIC.len() as u64;
        } else if valid < file_len {
            log.file.truncate(valid)?;
        }
        Ok((log, vids))
    }

    /// The log's file, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `vids`, durably (synced) before returning. If it fails, the
    /// log holds none of them.
    pub fn append(&mut self, vids: &[u64]) -> Result<(), StoreError> {
        self.write_records(vids, 0)
    }

    /// Records that `vids` were removed, durably (synced) before returning:
    /// the log no longer returns them unless appended again. If it fails,
    /// the log holds none of the removes.
    pub fn remove(&mut self, vids: &[u64]) -> Result<(), StoreError> {
        self.write_records(vids, REMOVE)
    }

    /// Appends records of `vids`, `flag` or-ed into each count.
    fn write_records(&mut self, vids: &[u64], flag: u32) -> Result<(), StoreError> {
        if vids.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(vids.len() * 8 + 16);
        for chunk in vids.chunks(RECORD_MAX) {
            encode_record(chunk, flag, &mut bytes);
        }
        if let Err(err) = self.file.write_at(self.len, &bytes) {
            // Leave no partial record behind for later appends to follow.
            let _ = self.file.truncate(self.len);
            return Err(err);
        }
        self.len += bytes.len() as u64;
        Ok(())
    }
}

fn head_of(count: u32) -> u32 {
    xxh3_64(&count.to_le_bytes()) as u32
}

/// Rewrites the two checksums of every whole record of `bytes` (a whole
/// log) to match it, from the first record on, as [`footer::reseal`] does
/// for the other files; stops at a record whose count is over the bound or
/// that does not fit. The magic is left as it is.
///
/// [`footer::reseal`]: super::footer::reseal
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn reseal(bytes: &mut [u8]) {
    let mut at = MAGIC.len();
    while bytes.len().saturating_sub(at) >= 8 {
        let field = u32_at(&bytes[at..], 0);
        let count = (field & !REMOVE) as usize;
        if count > RECORD_MAX {
            return;
        }
        bytes[at + 4..at + 8].copy_from_slice(&head_of(field).to_le_bytes());
        let need = 8 + count * 8 + 8;
        if bytes.len() - at < need {
            return;
        }
        let sum = xxh3_64(&bytes[at..at + need - 8]);
        bytes[at + need - 8..at + need].copy_from_slice(&sum.to_le_bytes());
        at += need;
    }
}

fn encode_record(vids: &[u64], flag: u32, out: &mut Vec<u8>) {
    let start = out.len();
    let count = u32::try_from(vids.len()).expect("records hold at most RECORD_MAX vids") | flag;
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&head_of(count).to_le_bytes());
    for vid in vids {
        out.extend_from_slice(&vid.to_le_bytes());
    }
    let sum = xxh3_64(&out[start..]);
    out.extend_from_slice(&sum.to_le_bytes());
}

/// The vids of a log file and the length of its valid content (shorter than
/// the file when the last record is torn), or where it is corrupt and how.
fn parse(bytes: &[u8]) -> Result<(Vec<u64>, u64), (u64, &'static str)> {
    const NOT_A_LOG: &str = "this is not a bitfold catalog (bad magic)";
    let mut vids = Vec::new();
    // For each removed vid, how many vids had been appended when it was
    // last removed: its appends before that are undone.
    let mut removed: HashMap<u64, usize> = HashMap::new();
    if bytes.len() < MAGIC.len() {
        // Only a crash while creating the file leaves less than the magic.
        return if MAGIC.starts_with(bytes) || bytes.iter().all(|&b| b == 0) {
            Ok((vids, 0))
        } else {
            Err((0, NOT_A_LOG))
        };
    }
    if &bytes[..MAGIC.len()] != MAGIC {
        return Err((0, NOT_A_LOG));
    }
    let mut at = MAGIC.len();
    let valid = loop {
        let rest = &bytes[at..];
        if rest.len() < 8 {
            break at;
        }
        let field = u32_at(rest, 0);
        let count = field & !REMOVE;
        if head_of(field) != u32_at(rest, 4) || count as usize > RECORD_MAX {
            // A crash can leave zeros where an append was going; anything
            // else in a record header is damage.
            if rest.iter().all(|&b| b == 0) {
                break at;
            }
            return Err((at as u64, "a record header fails its checksum"));
        }
        let need = 8 + count as usize * 8 + 8;
        if rest.len() < need {
            break at;
        }
        let body = &rest[..need - 8];
        if xxh3_64(body) != u64_at(rest, need - 8) {
            if rest.len() == need {
                break at;
            }
            return Err((at as u64, "a record fails its checksum"));
        }
        let record = (0..count as usize).map(|i| u64_at(body, 8 + i * 8));
        if field & REMOVE == 0 {
            vids.extend(record);
        } else {
            removed.extend(record.map(|vid| (vid, vids.len())));
        }
        at += need;
    };
    if !removed.is_empty() {
        let mut position = 0;
        vids.retain(|vid| {
            position += 1;
            removed.get(vid).is_none_or(|&undone| position > undone)
        });
    }
    Ok((vids, valid as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log of two records, [1, 2] then [3], in a fresh directory.
    fn two_records() -> (Arc<MemoryDirectory>, Vec<u8>) {
        let dir = Arc::new(MemoryDirectory::new());
        let (mut log, _) = VidLog::with_directory(dir.clone()).unwrap();
        log.append(&[1, 2]).unwrap();
        log.append(&[3]).unwrap();
        drop(log);
        let bytes = dir.read(VID_LOG_NAME).unwrap().to_vec();
        (dir, bytes)
    }

    fn put(dir: &Arc<MemoryDirectory>, bytes: &[u8]) {
        let mut file = dir.create(VID_LOG_NAME).unwrap();
        file.write_all(bytes).unwrap();
        file.commit().unwrap();
    }

    #[test]
    fn a_resealed_record_reads_as_changed() {
        let (dir, mut bytes) = two_records();
        // The first record's first vid: after the magic and its count and head.
        let vid = MAGIC.len() + 8;
        bytes[vid] = 7;
        put(&dir, &bytes);
        let refused = VidLog::with_directory(dir.clone()).unwrap_err().to_string();
        assert!(refused.contains("fails its checksum"), "{refused}");
        reseal(&mut bytes);
        put(&dir, &bytes);
        let (_, vids) = VidLog::with_directory(dir.clone()).unwrap();
        assert_eq!(vids, [7, 2, 3]);
        // A count made larger than the record: the header is resealed and the
        // record no longer fits, so it reads as the cut end of an append.
        bytes[MAGIC.len()] = 200;
        reseal(&mut bytes);
        put(&dir, &bytes);
        let (_, vids) = VidLog::with_directory(dir).unwrap();
        assert_eq!(vids, Vec::<u64>::new());
    }
}
