//! The `roaring` format: files named `<vid>.roaring`, each one portable
//! Roaring bitmap; a directory stands for every such file in it.

use std::fs;
use std::io::Read;
use std::path::Path;

use super::{Field, ImportError, Input, Inputs, Problem, parse_decimal};
use crate::portable;
use crate::vector::VectorBuf;

/// The largest a portable Roaring bitmap of 32-bit positions can be: 65536
/// bitmap containers behind the largest headers. A bigger file is refused
/// before it is read.
pub const MAX_ROARING_FILE: u64 = 8 + 8192 + (1 << 16) * (8 + 8192);

const SUFFIX: &str = ".roaring";

/// The vid a file name gives: `None` if the name does not end in `.roaring`,
/// an error if it does but the rest is not a vid.
pub(super) fn vid_of(path: &Path) -> Result<Option<u64>, ImportError> {
    let name = path
        .file_name()
        .map(|n| n.as_encoded_bytes())
        .unwrap_or_default();
    let Some(stem) = name.strip_suffix(SUFFIX.as_bytes()) else {
        return Ok(None);
    };
    parse_decimal(stem, Field::Vid)
        .map(Some)
        .map_err(|problem| ImportError::file(path, Problem::BadFileName(problem.to_string())))
}

/// Adds the `<vid>.roaring` files of directory `dir`, in name order, and
/// counts the other entries as skipped.
pub(super) fn expand_dir(dir: &Path, inputs: &mut Inputs) -> Result<(), ImportError> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| ImportError::io(dir, e))? {
        entries.push(entry.map_err(|e| ImportError::io(dir, e))?.path());
    }
    entries.sort();
    for path in entries {
        let meta = fs::metadata(&path).map_err(|e| ImportError::io(&path, e))?;
        match vid_of(&path)? {
            Some(vid) if meta.is_file() => inputs.files.push(Input {
                path,
                vid,
                len: meta.len(),
            }),
            _ => inputs.skipped += 1,
        }
    }
    Ok(())
}

/// Reads and fully checks one roaring file.
pub(super) fn read(input: &Input, progress: &dyn Fn(u64)) -> Result<VectorBuf, ImportError> {
    let path = &input.path;
    let file = fs::File::open(path).map_err(|e| ImportError::io(path, e))?;
    let len = file.metadata().map_err(|e| ImportError::io(path, e))?.len();
    if len > MAX_ROARING_FILE {
        return Err(ImportError::file(path, Problem::FileTooLarge(len)));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // The file may grow after the size check: never read past the limit.
    file.take(MAX_ROARING_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ImportError::io(path, e))?;
    progress(bytes.len() as u64);
    if bytes.len() as u64 > MAX_ROARING_FILE {
        return Err(ImportError::file(
            path,
            Problem::FileTooLarge(bytes.len() as u64),
        ));
    }
    portable::read(&bytes).map_err(|e| ImportError::file(path, Problem::InvalidRoaring(e)))
}
