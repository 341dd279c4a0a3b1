//! Sealed files: a small body written whole (staged, synced, renamed) and
//! read whole, closed by the store footer, so that a damaged or cut file is
//! refused with an error naming it instead of being half-read. The master
//! keeps its journal of pending updates in them.

use super::StoreError;
use super::footer::{self, ChecksumWriter, Kind};
use super::storage::Directory;

const SEALED: Kind = Kind {
    magic: *b"BFSEALED",
    version: 1,
    name: "sealed file",
};

/// Writes `body` as file `name` of `dir`, durably, replacing any file of
/// that name at once (a crash leaves the old file or the new one).
pub fn write_sealed(dir: &dyn Directory, name: &str, body: &[u8]) -> Result<(), StoreError> {
    let mut out = ChecksumWriter::new(dir.create(name)?);
    out.write(body)?;
    out.finish(&SEALED)?;
    Ok(())
}

/// Reads back the body of the sealed file `name` of `dir`, checked whole.
pub fn read_sealed(dir: &dyn Directory, name: &str) -> Result<Vec<u8>, StoreError> {
    let bytes = dir.read(name)?;
    footer::check_versions(&bytes, &SEALED, SEALED.version, &dir.path(name))
        .map(|(body, _)| body.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryDirectory;

    #[test]
    fn a_sealed_file_reads_back_and_damage_is_refused_by_name() {
        let dir = MemoryDirectory::new();
        write_sealed(&dir, "update-1.pending", b"the body").unwrap();
        assert_eq!(read_sealed(&dir, "update-1.pending").unwrap(), b"the body");
        let bytes = dir.read("update-1.pending").unwrap().to_vec();
        write_sealed(&dir, "update-1.pending", b"").unwrap();
        assert_eq!(read_sealed(&dir, "update-1.pending").unwrap(), b"");
        let mut cut = dir.create("cut").unwrap();
        cut.write_all(&bytes[..bytes.len() - 1]).unwrap();
        cut.commit().unwrap();
        let refused = read_sealed(&dir, "cut").unwrap_err().to_string();
        assert!(refused.contains("cut"), "{refused}");
        let mut flipped = bytes.clone();
        flipped[2] ^= 0x40;
        write_raw(&dir, "flipped", &flipped);
        let refused = read_sealed(&dir, "flipped").unwrap_err().to_string();
        assert!(refused.contains("checksum mismatch"), "{refused}");
    }

    fn write_raw(dir: &MemoryDirectory, name: &str, bytes: &[u8]) {
        let mut file = dir.create(name).unwrap();
        file.write_all(bytes).unwrap();
        file.commit().unwrap();
    }
}
