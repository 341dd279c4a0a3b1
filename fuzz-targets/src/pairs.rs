use std::io::Read;
use std::path::Path;

use bitfold_engine::import::{MAX_LINE, ReadError, parse_pairs};

/// The pairs reader, reading chunks of the size the first byte picks, fed
/// in pieces of that size: on input a naive line parser accepts it yields
/// the same pairs; on input it refuses, it fails on the same line.
pub fn pairs(data: &[u8]) {
    let Some((&piece, text)) = data.split_first() else {
        return;
    };
    let piece = usize::from(piece).max(1);
    let path = Path::new("fuzz.csv");
    let mut got = Vec::new();
    let read = parse_pairs(Pieces { text, piece }, piece, path, |vid, bit| {
        got.push((vid, bit));
        Ok::<(), ()>(())
    });
    match (naive(text), read) {
        (Ok(want), Ok(())) => assert_eq!(got, want),
        (Err(line), Err(ReadError::Input(e))) => {
            assert_eq!(e.line, Some(line), "{e}");
            assert_eq!(e.path, path);
        }
        (want, read) => panic!("the naive parser says {want:?}, the reader {read:?}"),
    }
}

/// A reader that hands out at most `piece` bytes at a time.
struct Pieces<'a> {
    text: &'a [u8],
    piece: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.piece.min(buf.len()).min(self.text.len());
        buf[..n].copy_from_slice(&self.text[..n]);
        self.text = &self.text[n..];
        Ok(n)
    }
}

/// The pairs of `text`, or the 1-based number of its first bad line.
fn naive(text: &[u8]) -> Result<Vec<(u64, u32)>, u64> {
    let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    let mut pairs = Vec::new();
    for (number, line) in (1..).zip(text.split(|&b| b == b'\n')) {
        if line.len() > MAX_LINE {
            return Err(number);
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let trimmed = trim(line);
        if trimmed.is_empty() || trimmed[0] == b'#' {
            continue;
        }
        let fields: Vec<&[u8]> = trimmed.split(|&b| b == b',').collect();
        let pair = match fields[..] {
            [vid, bit] => decimal(trim(vid)).zip(decimal(trim(bit))),
            _ => None,
        };
        match pair {
            Some((vid, bit)) if bit <= u64::from(u32::MAX) => pairs.push((vid, bit as u32)),
            _ => return Err(number),
        }
    }
    Ok(pairs)
}

fn trim(mut field: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = field {
        field = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = field {
        field = rest;
    }
    field
}

fn decimal(field: &[u8]) -> Option<u64> {
    if field.is_empty() || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    field.iter().try_fold(0u64, |value, &c| {
        value.checked_mul(10)?.checked_add(u64::from(c - b'0'))
    })
}
