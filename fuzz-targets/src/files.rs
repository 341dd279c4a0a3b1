//! A fuzzer's bytes as the files of a directory, for the targets that open
//! what a data directory holds (`store`, `master`).

use std::sync::Arc;

use bitfold_engine::store::{Directory, MemoryDirectory, reseal};

/// The bit of a record's name byte that asks for the file to be resealed.
pub const RESEAL: u8 = 0x80;

/// The files of `data` (see [`files`]) in a memory directory, resealed
/// where asked: a file's checksums are made to match its bytes
/// (`bitfold_engine::store::reseal`), so that mutations reach the checks
/// behind them. Text files (`.toml`) carry no checksum and are never
/// resealed.
pub fn directory(data: &[u8], names: &[&'static str]) -> Arc<MemoryDirectory> {
    let dir = Arc::new(MemoryDirectory::new());
    for (name, bytes, sealed) in files(data, names) {
        let mut bytes = bytes.to_vec();
        if sealed && !name.ends_with(".toml") {
            reseal(name, &mut bytes);
        }
        let mut file = dir.create(name).expect("a memory file can be created");
        file.write_all(&bytes)
            .expect("a memory file can be written");
        file.commit().expect("a memory file can be committed");
    }
    dir
}

/// Cuts `data` into files: each record is a name byte (its low seven bits
/// an index into `names`, modulo; its top bit [`RESEAL`]), a little-endian
/// `u32` length, and that many bytes (fewer at the end of the input). A
/// name given twice keeps the last, so only the last record of each name is
/// returned (an input of thousands of tiny records makes at most one file
/// per name), with whether to reseal it.
fn files<'a>(
    mut data: &'a [u8],
    names: &[&'static str],
) -> impl Iterator<Item = (&'static str, &'a [u8], bool)> {
    let mut files = vec![None; names.len()];
    while let [name, rest @ ..] = data {
        let Some((len, rest)) = rest.split_first_chunk::<4>() else {
            break;
        };
        let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
        files[usize::from(name & !RESEAL) % names.len()] = Some((&rest[..len], name & RESEAL != 0));
        data = &rest[len..];
    }
    names
        .iter()
        .copied()
        .zip(files)
        .filter_map(|(name, file)| file.map(|(bytes, sealed)| (name, bytes, sealed)))
}

/// `files` as the records [`directory`] reads: each as its index in
/// `names`, with [`RESEAL`] if `reseal`, its length and its bytes.
#[cfg(test)]
pub fn records(files: &[(&str, &[u8])], names: &[&str], reseal: bool) -> Vec<u8> {
    let mut input = Vec::new();
    for (name, bytes) in files {
        let index = names.iter().position(|n| n == name).expect("a known name") as u8;
        input.push(if reseal { index | RESEAL } else { index });
        input.extend((bytes.len() as u32).to_le_bytes());
        input.extend_from_slice(bytes);
    }
    input
}
