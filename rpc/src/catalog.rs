//! The master's durable catalog: which vids exist.
//!
//! A range term costs the number of existing vids in it, never its width,
//! because the master enumerates terms from this set. It lives in memory as
//! a `BTreeSet<u64>` and on disk as an append-only log, `catalog.log` in the
//! master's data directory:
//!
//! ```text
//! file   := magic record*
//! magic  := "BFCATLG1"
//! record := count:u32 head:u32 vid:u64{count} sum:u64      (little-endian)
//! ```
//!
//! `head` is the low half of the xxh3-64 of `count`'s bytes and `sum` the
//! xxh3-64 of everything before it in the record, so a record is either whole
//! and right or recognisably not. Records are only appended, and fsynced
//! before [`Catalog::insert`] returns. On open, a damaged *last* record (a
//! crash in the middle of an append) is dropped and cut off the file;
//! damage anywhere before the end is refused with an error naming the file.
//! The catalog never shrinks.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 8] = b"BFCATLG1";
/// The most vids one record holds; longer inserts are split.
const RECORD_MAX: usize = 1 << 20;
const FILE_NAME: &str = "catalog.log";

/// Why the catalog cannot be opened or written; messages name the file.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// Reading, writing or syncing the file failed.
    #[error("catalog file {}: {source}", path.display())]
    Io {
        /// The catalog file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is damaged before its end (not a torn append).
    #[error(
        "catalog file {} is corrupt at byte {offset}: {what}; restore it from a backup, \
         or move it away to rebuild the catalog from what the slaves report",
        path.display()
    )]
    Corrupt {
        /// The catalog file.
        path: PathBuf,
        /// Where the damage starts.
        offset: u64,
        /// What is wrong there.
        what: String,
    },
}

/// The set of existing vids, durable in an append-only log.
#[derive(Debug)]
pub struct Catalog {
    vids: BTreeSet<u64>,
    file: File,
    path: PathBuf,
    /// Length of the file's valid content; appends go here.
    len: u64,
}

impl Catalog {
    /// Opens the catalog in `dir` (created if missing), dropping a torn last
    /// record and refusing earlier damage.
    pub fn open(dir: &Path) -> Result<Catalog, CatalogError> {
        let path = dir.join(FILE_NAME);
        let io = |source| CatalogError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let (vids, valid) = parse(&bytes).map_err(|(offset, what)| CatalogError::Corrupt {
            path: path.clone(),
            offset,
            what,
        })?;
        let mut catalog = Catalog {
            vids,
            file,
            path,
            len: valid,
        };
        if valid < MAGIC.len() as u64 {
            catalog.truncate_to(0)?;
            catalog.append(MAGIC)?;
            sync_dir(dir).map_err(|source| CatalogError::Io {
                path: catalog.path.clone(),
                source,
            })?;
        } else if valid < bytes.len() as u64 {
            catalog.truncate_to(valid)?;
        }
        Ok(catalog)
    }

    /// The catalog file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether vector `vid` exists.
    pub fn contains(&self, vid: u64) -> bool {
        self.vids.contains(&vid)
    }

    /// The existing vids in `first..=last`, ascending.
    pub fn range(&self, first: u64, last: u64) -> impl Iterator<Item = u64> + '_ {
        self.vids.range(first..=last).copied()
    }

    /// Number of existing vids.
    pub fn len(&self) -> usize {
        self.vids.len()
    }

    /// Whether no vid exists.
    pub fn is_empty(&self) -> bool {
        self.vids.is_empty()
    }

    /// Records `vids` as existing, durably (fsynced) before returning;
    /// returns how many were new. Vids already known cost nothing.
    pub fn insert(&mut self, vids: impl IntoIterator<Item = u64>) -> Result<usize, CatalogError> {
        let new: BTreeSet<u64> = vids
            .into_iter()
            .filter(|v| !self.vids.contains(v))
            .collect();
        if new.is_empty() {
            return Ok(0);
        }
        let new: Vec<u64> = new.into_iter().collect();
        let mut bytes = Vec::with_capacity(new.len() * 8 + 16);
        for chunk in new.chunks(RECORD_MAX) {
            encode_record(chunk, &mut bytes);
        }
        let before = self.len;
        if let Err(err) = self.append(&bytes) {
            // Leave no partial record behind for later appends to follow.
            let _ = self.truncate_to(before);
            return Err(err);
        }
        self.vids.extend(new.iter().copied());
        Ok(new.len())
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), CatalogError> {
        let result = self
            .file
            .seek(SeekFrom::Start(self.len))
            .and_then(|_| self.file.write_all(bytes));
        result.map_err(|source| self.io(source))?;
        self.len += bytes.len() as u64;
        self.sync()
    }

    fn sync(&mut self) -> Result<(), CatalogError> {
        self.file.sync_data().map_err(|source| self.io(source))
    }

    fn truncate_to(&mut self, len: u64) -> Result<(), CatalogError> {
        self.file.set_len(len).map_err(|source| self.io(source))?;
        self.len = len;
        self.sync()
    }

    fn io(&self, source: std::io::Error) -> CatalogError {
        CatalogError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn head_of(count: u32) -> u32 {
    xxh3_64(&count.to_le_bytes()) as u32
}

fn encode_record(vids: &[u64], out: &mut Vec<u8>) {
    let start = out.len();
    let count = u32::try_from(vids.len()).expect("records hold at most RECORD_MAX vids");
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&head_of(count).to_le_bytes());
    for vid in vids {
        out.extend_from_slice(&vid.to_le_bytes());
    }
    let sum = xxh3_64(&out[start..]);
    out.extend_from_slice(&sum.to_le_bytes());
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The vids of a catalog file and the length of its valid content (shorter
/// than the file when the last record is torn), or where it is corrupt.
fn parse(bytes: &[u8]) -> Result<(BTreeSet<u64>, u64), (u64, String)> {
    let mut vids = BTreeSet::new();
    if bytes.len() < MAGIC.len() {
        // Only a crash while creating the file leaves less than the magic.
        return if MAGIC.starts_with(bytes) || bytes.iter().all(|&b| b == 0) {
            Ok((vids, 0))
        } else {
            Err((0, "this is not a bitfold catalog (bad magic)".into()))
        };
    }
    if &bytes[..MAGIC.len()] != MAGIC {
        return Err((0, "this is not a bitfold catalog (bad magic)".into()));
    }
    let mut at = MAGIC.len();
    let torn = |at: usize| Ok::<_, (u64, String)>(at as u64);
    let valid = loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            break at as u64;
        }
        if rest.len() < 8 {
            break torn(at)?;
        }
        let count = u32_at(rest, 0);
        if head_of(count) != u32_at(rest, 4) || count as usize > RECORD_MAX {
            // A crash can leave zeros where an append was going; anything
            // else in a record header is damage.
            if rest.iter().all(|&b| b == 0) {
                break torn(at)?;
            }
            return Err((at as u64, "a record header fails its checksum".into()));
        }
        let need = 8 + count as usize * 8 + 8;
        if rest.len() < need {
            break torn(at)?;
        }
        let body = &rest[..need - 8];
        if xxh3_64(body) != u64_at(rest, need - 8) {
            if rest.len() == need {
                break torn(at)?;
            }
            return Err((at as u64, "a record fails its checksum".into()));
        }
        vids.extend((0..count as usize).map(|i| u64_at(body, 8 + i * 8)));
        at += need;
    };
    Ok((vids, valid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_len(dir: &Path) -> u64 {
        std::fs::metadata(dir.join(FILE_NAME)).unwrap().len()
    }

    #[test]
    fn survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut catalog = Catalog::open(dir.path()).unwrap();
        assert!(catalog.is_empty());
        assert_eq!(catalog.insert([5, 1, u64::MAX, 5]).unwrap(), 3);
        assert_eq!(catalog.insert([1, 7]).unwrap(), 1);
        assert_eq!(catalog.insert([7]).unwrap(), 0);
        drop(catalog);
        let catalog = Catalog::open(dir.path()).unwrap();
        assert_eq!(
            catalog.range(0, u64::MAX).collect::<Vec<_>>(),
            vec![1, 5, 7, u64::MAX]
        );
        assert_eq!(catalog.range(2, 7).collect::<Vec<_>>(), vec![5, 7]);
        assert!(catalog.contains(u64::MAX) && !catalog.contains(2));
    }

    #[test]
    fn a_torn_last_record_is_dropped_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let mut catalog = Catalog::open(dir.path()).unwrap();
        catalog.insert([1, 2]).unwrap();
        let whole = file_len(dir.path());
        catalog.insert([3, 4, 5]).unwrap();
        let full = file_len(dir.path());
        drop(catalog);
        let path = dir.path().join(FILE_NAME);
        let bytes = std::fs::read(&path).unwrap();
        for cut in [whole + 1, whole + 7, whole + 12, full - 1] {
            std::fs::write(&path, &bytes[..cut as usize]).unwrap();
            let catalog = Catalog::open(dir.path()).unwrap();
            assert_eq!(
                catalog.range(0, 9).collect::<Vec<_>>(),
                vec![1, 2],
                "cut at {cut}"
            );
            assert_eq!(file_len(dir.path()), whole);
        }
        // A crash that extended the file with zeros.
        let mut zeros = bytes[..whole as usize].to_vec();
        zeros.extend([0; 40]);
        std::fs::write(&path, &zeros).unwrap();
        let mut catalog = Catalog::open(dir.path()).unwrap();
        catalog.insert([9]).unwrap();
        drop(catalog);
        let catalog = Catalog::open(dir.path()).unwrap();
        assert_eq!(catalog.range(0, 9).collect::<Vec<_>>(), vec![1, 2, 9]);
    }

    #[test]
    fn damage_before_the_end_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut catalog = Catalog::open(dir.path()).unwrap();
        catalog.insert([1, 2]).unwrap();
        catalog.insert([3]).unwrap();
        drop(catalog);
        let path = dir.path().join(FILE_NAME);
        let good = std::fs::read(&path).unwrap();
        for (at, what) in [
            (17, "a record fails its checksum"),
            (9, "a record header fails"),
        ] {
            let mut bytes = good.clone();
            bytes[at] ^= 0x40;
            std::fs::write(&path, &bytes).unwrap();
            let message = Catalog::open(dir.path()).unwrap_err().to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(
                message.contains("corrupt at byte 8") && message.contains(what),
                "{message}"
            );
        }
        std::fs::write(&path, b"something else entirely").unwrap();
        let message = Catalog::open(dir.path()).unwrap_err().to_string();
        assert!(message.contains("bad magic"), "{message}");
    }

    #[test]
    fn a_torn_creation_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), &MAGIC[..3]).unwrap();
        let mut catalog = Catalog::open(dir.path()).unwrap();
        catalog.insert([4]).unwrap();
        drop(catalog);
        assert!(Catalog::open(dir.path()).unwrap().contains(4));
    }
}
