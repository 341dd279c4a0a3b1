//! The one place that memory-maps a file.

use std::fs::File;
use std::io;

use memmap2::Mmap;

/// Maps the whole of `file` read-only.
///
/// Only ever called on files of a store's data directory that have been
/// renamed into place: bitfold never opens those for writing again, never
/// truncates them, and replaces them only by renaming a new file over the
/// name (which leaves this map on the old inode).
pub(crate) fn map(file: &File) -> io::Result<Mmap> {
    // SAFETY: the mapped file is immutable once renamed in (see above), so no
    // write through another handle changes the bytes behind the map while it
    // lives; deleting the file keeps the inode alive until the map is dropped.
    // Another program editing the data directory by hand is outside what the
    // store can defend against, and the footer checksum catches such damage
    // when the store is opened.
    let map = unsafe { Mmap::map(file) }?;
    // Only a hint: where the kernel caches files in huge pages, a map read
    // back from disk (after a restart) is read ahead and mapped a huge page
    // at a time, as a freshly written one is (see `storage::CHUNK`).
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(map)
}
