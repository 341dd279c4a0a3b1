//! Where a store's files live: the [`Directory`] contract, with a
//! memory-mapped implementation over a real directory and an in-memory one
//! that runs the same store code in tests.
//!
//! The contract is small because the store only ever needs four things: list
//! the files, read a whole file as bytes that stay valid while held, write a
//! new file that appears atomically (or not at all) under its name, and delete
//! a file. Store files are never modified in place; the one exception is an
//! append-only log ([`super::VidLog`]), which grows through an [`AppendFile`].

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Seek, SeekFrom, Write};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use memmap2::Mmap;

use super::StoreError;
use super::mmap;

/// The bytes of a whole file, valid while held even if the file is deleted or
/// replaced meanwhile. Cloning is cheap (shared). The start is 64-byte
/// aligned (page-aligned when mapped), so words the file aligns are aligned
/// in memory too.
#[derive(Clone)]
pub struct FileBytes(Arc<Backing>);

enum Backing {
    Map(Mmap),
    /// The bytes are `len` bytes from word `start` of `words`, which is
    /// never resized, so the alignment found for `start` holds.
    Heap {
        words: Vec<u64>,
        start: usize,
        len: usize,
    },
}

/// The alignment [`FileBytes`] guarantees.
const ALIGN: usize = 64;

impl FileBytes {
    /// Copies `bytes` into 64-byte-aligned memory.
    pub fn copy_from(bytes: &[u8]) -> FileBytes {
        let spare = ALIGN / 8 - 1;
        let mut words = vec![0u64; bytes.len().div_ceil(8) + spare];
        let misalignment = words.as_ptr() as usize % ALIGN;
        let start = (ALIGN - misalignment) % ALIGN / 8;
        let target = bytemuck::cast_slice_mut::<u64, u8>(&mut words[start..]);
        target[..bytes.len()].copy_from_slice(bytes);
        FileBytes(Arc::new(Backing::Heap {
            words,
            start,
            len: bytes.len(),
        }))
    }
}

impl Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &*self.0 {
            Backing::Map(map) => map,
            Backing::Heap { words, start, len } => &bytemuck::cast_slice(&words[*start..])[..*len],
        }
    }
}

impl fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileBytes({} bytes)", self.len())
    }
}

/// A file being written. Nothing is visible under its name until
/// [`FileWriter::commit`]; dropping an uncommitted writer discards it.
pub trait FileWriter: Send {
    /// Appends `bytes`.
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), StoreError>;

    /// Makes the file durable and visible under its name, atomically
    /// replacing any file of that name: after a crash at any instant, the name
    /// holds either the old file or all of the new one.
    fn commit(self: Box<Self>) -> Result<(), StoreError>;
}

/// A file that only grows, durably: each append is on disk when it returns.
/// For logs; store files are written whole through [`FileWriter`].
pub trait AppendFile: Send {
    /// Writes `bytes` at byte `at` (the end of the valid content, which a
    /// torn append may have left garbage after) and makes them durable.
    fn write_at(&mut self, at: u64, bytes: &[u8]) -> Result<(), StoreError>;

    /// Cuts the file to `len` bytes, durably.
    fn truncate(&mut self, len: u64) -> Result<(), StoreError>;
}

/// The files of one store.
pub trait Directory: Send + Sync + fmt::Debug {
    /// Where file `name` lives, for messages.
    fn path(&self, name: &str) -> PathBuf;

    /// The names of the files held, in no particular order. An implementation
    /// that stages writes in files shows an uncommitted `name` as `name.tmp`.
    fn list(&self) -> Result<Vec<String>, StoreError>;

    /// The whole content of file `name`.
    fn read(&self, name: &str) -> Result<FileBytes, StoreError>;

    /// Starts writing file `name` (see [`FileWriter`]).
    fn create(&self, name: &str) -> Result<Box<dyn FileWriter>, StoreError>;

    /// Removes file `name`; bytes already read from it stay valid. The
    /// removal may be lost in a crash until [`Directory::sync`].
    fn delete(&self, name: &str) -> Result<(), StoreError>;

    /// Makes every removal so far durable (a record whose removal is a
    /// commit, such as a master's journal entry, must not come back).
    fn sync(&self) -> Result<(), StoreError>;

    /// Opens file `name` to append to (see [`AppendFile`]), creating it empty,
    /// durably, if missing.
    fn open_append(&self, name: &str) -> Result<Box<dyn AppendFile>, StoreError>;
}

/// The name of the lock file that keeps two processes out of one directory.
const LOCK_NAME: &str = "LOCK";

/// A real directory whose files are read through memory maps.
///
/// Holds an exclusive lock on its `LOCK` file while it lives, so two
/// processes cannot run a store on the same directory.
pub struct MmapDirectory {
    root: PathBuf,
    _lock: File,
}

impl fmt::Debug for MmapDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmapDirectory")
            .field("root", &self.root)
            .finish()
    }
}

impl MmapDirectory {
    /// Opens `root` (creating it if missing) and locks it.
    pub fn open(root: impl AsRef<Path>) -> Result<MmapDirectory, StoreError> {
        let root = root.as_ref().to_path_buf();
        if !root.is_dir() {
            fs::create_dir_all(&root).map_err(|e| StoreError::io("create", &root, e))?;
            // The new directory's own entry must survive a crash too.
            match root.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent)?,
                _ => sync_dir(Path::new("."))?,
            }
        }
        let lock_path = root.join(LOCK_NAME);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StoreError::io("create", &lock_path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    dir: root,
                    lock: lock_path,
                });
            }
            Err(fs::TryLockError::Error(e)) => return Err(StoreError::io("lock", lock_path, e)),
        }
        Ok(MmapDirectory { root, _lock: lock })
    }
}

/// Makes the renames and creations in directory `root` durable.
fn sync_dir(root: &Path) -> Result<(), StoreError> {
    File::open(root)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| StoreError::io("sync", root, e))
}

impl Directory for MmapDirectory {
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn list(&self) -> Result<Vec<String>, StoreError> {
        let entries =
            fs::read_dir(&self.root).map_err(|e| StoreError::io("list", &self.root, e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", &self.root, e))?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn read(&self, name: &str) -> Result<FileBytes, StoreError> {
        let path = self.path(name);
        let file = File::open(&path).map_err(|e| StoreError::io("open", &path, e))?;
        let len = file
            .metadata()
            .map_err(|e| StoreError::io("stat", &path, e))?
            .len();
        if len == 0 {
            // An empty file cannot be mapped (and holds nothing to map).
            return Ok(FileBytes::copy_from(&[]));
        }
        // No fallback to reading a file whose map failed: the files are
        // large, and copying them to the heap would trade a clear error for
        // an allocation failure.
        let map = mmap::map(&file).map_err(|e| StoreError::io("memory-map", &path, e))?;
        Ok(FileBytes(Arc::new(Backing::Map(map))))
    }

    fn create(&self, name: &str) -> Result<Box<dyn FileWriter>, StoreError> {
        let temp = self.path(&format!("{name}.tmp"));
        let file = File::create(&temp).map_err(|e| StoreError::io("create", &temp, e))?;
        Ok(Box::new(StagedFile {
            root: self.root.clone(),
            target: self.path(name),
            temp,
            file: Some(ChunkWriter::new(file)),
            written: 0,
            handed_on: 0,
        }))
    }

    fn delete(&self, name: &str) -> Result<(), StoreError> {
        let path = self.path(name);
        // Not synced: a deletion lost in a crash leaves a file the manifest
        // does not name, which the store removes when it next opens.
        fs::remove_file(&path).map_err(|e| StoreError::io("delete", &path, e))
    }

    fn sync(&self) -> Result<(), StoreError> {
        sync_dir(&self.root)
    }

    fn open_append(&self, name: &str) -> Result<Box<dyn AppendFile>, StoreError> {
        let path = self.path(name);
        let existed = path.exists();
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io("open", &path, e))?;
        if !existed {
            sync_dir(&self.root)?;
        }
        Ok(Box::new(LogFile { path, file }))
    }
}

/// A real file appended to in place.
struct LogFile {
    path: PathBuf,
    file: File,
}

impl AppendFile for LogFile {
    fn write_at(&mut self, at: u64, bytes: &[u8]) -> Result<(), StoreError> {
        self.file
            .seek(SeekFrom::Start(at))
            .and_then(|_| self.file.write_all(bytes))
            .map_err(|e| StoreError::io("write", &self.path, e))?;
        self.file
            .sync_data()
            .map_err(|e| StoreError::io("sync", &self.path, e))
    }

    fn truncate(&mut self, len: u64) -> Result<(), StoreError> {
        self.file
            .set_len(len)
            .map_err(|e| StoreError::io("truncate", &self.path, e))?;
        self.file
            .sync_data()
            .map_err(|e| StoreError::io("sync", &self.path, e))
    }
}

/// Bytes a staged file lets pile up in the page cache before it asks the
/// kernel to start writing them to disk (see [`StagedFile::write_all`]).
const WRITE_BEHIND: u64 = 4 << 20;

/// A file written under a temporary name, renamed into place on commit.
struct StagedFile {
    root: PathBuf,
    target: PathBuf,
    temp: PathBuf,
    file: Option<ChunkWriter<File>>,
    /// Bytes given to `write_all` so far.
    written: u64,
    /// Bytes the kernel has been asked to start writing to disk.
    handed_on: u64,
}

/// The size and alignment of the pieces a staged file is written in: a
/// huge page (2 MiB on x86-64). A kernel that caches files in large folios
/// (Linux 6.16 and later on ext4, earlier on XFS) caches a whole aligned
/// huge page written at once as one huge folio, and maps it into the
/// store's memory maps with one page-table entry: reading a 128 KiB vector
/// then walks one entry where small pages take 32.
const CHUNK: usize = 2 << 20;

/// Writes to `W` in whole [`CHUNK`]s at offsets that are multiples of it,
/// the last one shorter.
struct ChunkWriter<W> {
    file: W,
    /// Bytes after the last whole chunk written, fewer than [`CHUNK`];
    /// its capacity is one chunk from the start, so it never grows.
    buffer: Vec<u8>,
}

impl<W: Write> ChunkWriter<W> {
    fn new(file: W) -> ChunkWriter<W> {
        ChunkWriter {
            file,
            buffer: Vec::with_capacity(CHUNK),
        }
    }

    /// Writes `bytes` after those already given: what completes the
    /// buffered chunk goes with it, whole chunks straight from `bytes`,
    /// and the rest waits in the buffer.
    fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        if !self.buffer.is_empty() {
            let n = bytes.len().min(CHUNK - self.buffer.len());
            self.buffer.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buffer.len() < CHUNK {
                return Ok(());
            }
            self.file.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        let whole = bytes.len() - bytes.len() % CHUNK;
        self.file.write_all(&bytes[..whole])?;
        self.buffer.extend_from_slice(&bytes[whole..]);
        Ok(())
    }

    /// Writes the last, partial chunk and hands back the file.
    fn finish(mut self) -> io::Result<W> {
        self.file.write_all(&self.buffer)?;
        Ok(self.file)
    }
}

/// Asks the kernel to start writing what has reached `file` since
/// `handed_on` (of the `written` bytes given to it, those not still in its
/// buffer), once that is [`WRITE_BEHIND`] bytes or more, without waiting:
/// the disk then writes while the rest of the file is built, and the sync on
/// commit waits only for the tail. Only a hint: if it fails, that sync still
/// writes everything and reports any error.
fn write_behind(file: &ChunkWriter<File>, written: u64, handed_on: &mut u64) {
    let reached = written - file.buffer.len() as u64;
    if reached - *handed_on >= WRITE_BEHIND {
        start_writeback(&file.file, *handed_on, reached - *handed_on);
        *handed_on = reached;
    }
}

/// Starts writing `len` bytes of `file` from `offset` to disk, not waiting.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the call's duration (`file` is
    // borrowed); the call reads no memory of ours.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// Elsewhere the sync on commit writes everything.
#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

impl FileWriter for StagedFile {
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let file = self.file.as_mut().expect("only commit takes the file");
        file.write_all(bytes)
            .map_err(|e| StoreError::io("write", &self.temp, e))?;
        self.written += bytes.len() as u64;
        write_behind(file, self.written, &mut self.handed_on);
        Ok(())
    }

    fn commit(mut self: Box<Self>) -> Result<(), StoreError> {
        let file = self.file.take().expect("commit runs once");
        let file = file
            .finish()
            .map_err(|e| StoreError::io("write", &self.temp, e))?;
        file.sync_all()
            .map_err(|e| StoreError::io("sync", &self.temp, e))?;
        drop(file);
        fs::rename(&self.temp, &self.target)
            .map_err(|e| StoreError::io("rename into place", &self.target, e))?;
        sync_dir(&self.root)
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Never committed: the staged bytes are garbage. If removing them
            // fails, the store removes the leftover when it next opens.
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// Files held in memory: the store's code without durability, for tests and
/// for [`super::Store::in_memory`].
#[derive(Debug, Default)]
pub struct MemoryDirectory {
    files: Arc<Mutex<MemoryFiles>>,
}

type MemoryFiles = HashMap<String, FileBytes>;

fn lock(files: &Mutex<MemoryFiles>) -> std::sync::MutexGuard<'_, MemoryFiles> {
    files.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryDirectory {
    /// An empty directory.
    pub fn new() -> MemoryDirectory {
        MemoryDirectory::default()
    }

    fn files(&self) -> std::sync::MutexGuard<'_, MemoryFiles> {
        lock(&self.files)
    }
}

impl Directory for MemoryDirectory {
    fn path(&self, name: &str) -> PathBuf {
        Path::new("<memory>").join(name)
    }

    fn list(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.files().keys().cloned().collect())
    }

    fn read(&self, name: &str) -> Result<FileBytes, StoreError> {
        self.files()
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::io("open", self.path(name), io::ErrorKind::NotFound.into()))
    }

    fn create(&self, name: &str) -> Result<Box<dyn FileWriter>, StoreError> {
        Ok(Box::new(MemoryFile {
            files: Arc::clone(&self.files),
            name: name.to_owned(),
            bytes: Vec::new(),
        }))
    }

    fn delete(&self, name: &str) -> Result<(), StoreError> {
        match self.files().remove(name) {
            Some(_) => Ok(()),
            None => Err(StoreError::io(
                "delete",
                self.path(name),
                io::ErrorKind::NotFound.into(),
            )),
        }
    }

    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn open_append(&self, name: &str) -> Result<Box<dyn AppendFile>, StoreError> {
        self.files()
            .entry(name.to_owned())
            .or_insert_with(|| FileBytes::copy_from(&[]));
        Ok(Box::new(MemoryFile {
            files: Arc::clone(&self.files),
            name: name.to_owned(),
            bytes: Vec::new(),
        }))
    }
}

/// A file of a [`MemoryDirectory`] being written, or appended to.
struct MemoryFile {
    files: Arc<Mutex<MemoryFiles>>,
    name: String,
    bytes: Vec<u8>,
}

impl FileWriter for MemoryFile {
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<(), StoreError> {
        let bytes = FileBytes::copy_from(&self.bytes);
        lock(&self.files).insert(self.name, bytes);
        Ok(())
    }
}

impl MemoryFile {
    /// Replaces the held file's bytes with what `change` makes of them.
    fn change(&self, change: impl FnOnce(&mut Vec<u8>)) {
        let mut files = lock(&self.files);
        let mut bytes = files
            .get(&self.name)
            .map(|b| b.to_vec())
            .unwrap_or_default();
        change(&mut bytes);
        files.insert(self.name.clone(), FileBytes::copy_from(&bytes));
    }
}

impl AppendFile for MemoryFile {
    fn write_at(&mut self, at: u64, bytes: &[u8]) -> Result<(), StoreError> {
        self.change(|file| {
            file.truncate(at as usize);
            file.resize(at as usize, 0);
            file.extend_from_slice(bytes);
        });
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> Result<(), StoreError> {
        self.change(|file| file.resize(len as usize, 0));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A file that records where each write began and how long it was.
    #[derive(Default)]
    struct Recorded {
        bytes: Vec<u8>,
        writes: Vec<(usize, usize)>,
    }

    impl Write for Recorded {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if !buf.is_empty() {
                self.writes.push((self.bytes.len(), buf.len()));
            }
            self.bytes.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the sizes of the pieces, the file holds them in order,
        /// and every write but the last starts on a chunk boundary and is a
        /// whole number of chunks.
        #[test]
        fn a_staged_file_is_written_in_whole_aligned_chunks(
            sizes in prop::collection::vec(
                prop_oneof![0usize..100, 0usize..(3 * CHUNK), Just(CHUNK), Just(CHUNK - 1)],
                0..8,
            ),
        ) {
            let pieces: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &len)| (0..len).map(|b| (b * 7 + i) as u8).collect())
                .collect();
            let mut writer = ChunkWriter::new(Recorded::default());
            for piece in &pieces {
                writer.write_all(piece).unwrap();
            }
            let file = writer.finish().unwrap();
            prop_assert_eq!(&file.bytes, &pieces.concat());
            if let Some((_, but_last)) = file.writes.split_last() {
                for &(at, len) in but_last {
                    prop_assert_eq!(at % CHUNK, 0, "a write at {}", at);
                    prop_assert_eq!(len % CHUNK, 0, "a write of {}", len);
                }
                let &(at, _) = file.writes.last().unwrap();
                prop_assert_eq!(at % CHUNK, 0, "the last write at {}", at);
            }
        }
    }
}
