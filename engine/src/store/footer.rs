//! The footer every store file ends with, and the writer that computes its
//! checksum while the file streams out.
//!
//! ```text
//! body ... | version u32 | reserved u32 (0) | length u64 | checksum u64 | magic [u8; 8]
//! ```
//!
//! `length` is the whole file's, footer included; `checksum` is the xxh3-64
//! of every byte before it. A file is accepted only if its magic, length,
//! version and checksum all match, so a truncated, extended or damaged file is
//! refused before anything in it is used.

use std::path::Path;

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::StoreError;
use super::storage::FileWriter;

/// Bytes of the footer.
pub(crate) const FOOTER_LEN: usize = 32;

/// What kind of file a footer closes: its magic, format version and name.
pub(crate) struct Kind {
    pub(crate) magic: [u8; 8],
    pub(crate) version: u32,
    pub(crate) name: &'static str,
}

/// Streams a file out while hashing it and counting its bytes.
pub(crate) struct ChecksumWriter {
    out: Box<dyn FileWriter>,
    hasher: Box<Xxh3>,
    len: u64,
}

impl ChecksumWriter {
    pub(crate) fn new(out: Box<dyn FileWriter>) -> Self {
        ChecksumWriter {
            out,
            hasher: Box::new(Xxh3::new()),
            len: 0,
        }
    }

    /// Bytes written so far.
    pub(crate) fn position(&self) -> u64 {
        self.len
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
        self.out.write_all(bytes)
    }

    /// Writes zero bytes up to the next multiple of `align`.
    pub(crate) fn pad_to(&mut self, align: u64) -> Result<(), StoreError> {
        const ZEROS: [u8; 64] = [0; 64];
        let pad = self.len.next_multiple_of(align) - self.len;
        self.write(&ZEROS[..pad as usize])
    }

    /// Appends the footer and commits the file; returns its length.
    pub(crate) fn finish(mut self, kind: &Kind) -> Result<u64, StoreError> {
        let len = self.len + FOOTER_LEN as u64;
        self.write(&kind.version.to_le_bytes())?;
        self.write(&0u32.to_le_bytes())?;
        self.write(&len.to_le_bytes())?;
        let checksum = self.hasher.digest();
        self.write(&checksum.to_le_bytes())?;
        self.write(&kind.magic)?;
        self.out.commit()?;
        Ok(len)
    }
}

/// Rewrites the length and the checksum in the footer of `bytes` (a whole
/// file) to match them, leaving its magic, version and reserved field as
/// they are: how a test or a fuzz target makes a damaged body reach the
/// checks behind the checksum, as a bug in a writer would. Shorter than a
/// footer: left alone.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn reseal(bytes: &mut [u8]) {
    let Some(at) = bytes.len().checked_sub(FOOTER_LEN) else {
        return;
    };
    let len = bytes.len() as u64;
    bytes[at + 8..at + 16].copy_from_slice(&len.to_le_bytes());
    let checksum = xxh3_64(&bytes[..at + 16]);
    bytes[at + 16..at + 24].copy_from_slice(&checksum.to_le_bytes());
}

pub(crate) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks the footer of `bytes` (the whole file at `path`), accepting every
/// format version from `oldest` to `kind.version`; returns the body and the
/// file's version.
pub(crate) fn check_versions<'a>(
    bytes: &'a [u8],
    kind: &Kind,
    oldest: u32,
    path: &Path,
) -> Result<(&'a [u8], u32), StoreError> {
    let corrupt = |problem: String| StoreError::corrupt(path, problem);
    if bytes.len() < FOOTER_LEN {
        return Err(corrupt(format!(
            "it is {} bytes long, shorter than a footer: the file is truncated",
            bytes.len()
        )));
    }
    let footer = &bytes[bytes.len() - FOOTER_LEN..];
    if footer[24..] != kind.magic {
        return Err(corrupt(format!(
            "it does not end with the {} magic: the file is truncated or is not a bitfold {}",
            kind.name, kind.name
        )));
    }
    let declared = u64_at(footer, 8);
    if declared != bytes.len() as u64 {
        return Err(corrupt(format!(
            "its footer says {declared} bytes but it has {}: the file was cut or spliced",
            bytes.len()
        )));
    }
    let version = u32_at(footer, 0);
    if !(oldest..=kind.version).contains(&version) {
        return Err(StoreError::Version {
            path: path.to_path_buf(),
            found: version,
            supported: kind.version,
        });
    }
    let stored = u64_at(footer, 16);
    let actual = xxh3_64(&bytes[..bytes.len() - 16]);
    if stored != actual {
        return Err(corrupt(format!(
            "checksum mismatch (stored {stored:#018x}, computed {actual:#018x})"
        )));
    }
    if u32_at(footer, 4) != 0 {
        return Err(corrupt("its footer's reserved field is not zero".into()));
    }
    Ok((&bytes[..bytes.len() - FOOTER_LEN], version))
}
