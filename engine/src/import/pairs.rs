//! The `pairs` format: one `vid,bit` per line, in decimal.
//!
//! Spaces and tabs may surround a field, lines may end in CRLF, blank lines
//! and lines whose first non-blank character is `#` are skipped, and a UTF-8
//! byte order mark at the start of a file is ignored. Parsing works on bytes
//! in large chunks with no per-line allocation: this is the bulk-load path.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use super::{Field, ImportError, Problem, ReadError, parse_decimal, show};

/// The longest line accepted, in bytes (a valid line needs at most 31 plus blanks).
pub const MAX_LINE: usize = 4096;

/// Bytes read at a time from a file.
const CHUNK: usize = 1 << 20;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Parses the pairs file at `path`, calling `on_pair` for each pair in file
/// order and `progress` with the bytes of each chunk read.
pub(super) fn parse<E>(
    path: &Path,
    progress: &dyn Fn(u64),
    on_pair: impl FnMut(u64, u32) -> Result<(), E>,
) -> Result<(), ReadError<E>> {
    let file = File::open(path).map_err(|e| ImportError::io(path, e))?;
    parse_from(file, CHUNK, path, progress, on_pair)
}

/// Parses the pairs text `input` reads, at most `chunk` bytes at a time
/// (the buffer holds a chunk and a longest line), as [`parse`] does the
/// file at `path` (the name its errors give).
pub(super) fn parse_from<E>(
    mut input: impl Read,
    chunk: usize,
    path: &Path,
    progress: &dyn Fn(u64),
    mut on_pair: impl FnMut(u64, u32) -> Result<(), E>,
) -> Result<(), ReadError<E>> {
    let mut buf = vec![0u8; chunk.max(1) + MAX_LINE + 1];
    let (mut filled, mut line) = (0usize, 1u64);
    // `buf[..scanned]` holds no line end: a short read scans only what it added.
    let mut scanned = 0;
    let mut first = true;
    loop {
        let read =
            read_some(&mut input, &mut buf[filled..]).map_err(|e| ImportError::io(path, e))?;
        progress(read as u64);
        filled += read;
        let at_end = read == 0;
        let mut start = 0;
        if first && (filled >= BOM.len() || at_end) {
            first = false;
            if buf[..filled].starts_with(BOM) {
                start = BOM.len();
            }
        } else if first {
            continue;
        }
        // Whole lines only, except the last line of the file.
        let complete = if at_end {
            filled
        } else {
            let from = start.max(scanned);
            memchr::memrchr(b'\n', &buf[from..filled]).map_or(start, |i| from + i + 1)
        };
        parse_lines(&buf[start..complete], &mut line, &mut on_pair).map_err(|e| match e {
            Stop::Bad(problem, line) => ReadError::Input(ImportError {
                path: path.to_path_buf(),
                line: Some(line),
                problem,
            }),
            Stop::Sink(e) => ReadError::Sink(e),
        })?;
        if at_end {
            return Ok(());
        }
        if complete > 0 {
            buf.copy_within(complete..filled, 0);
            filled -= complete;
        }
        scanned = filled;
        if filled > MAX_LINE {
            return Err(ReadError::Input(ImportError {
                path: path.to_path_buf(),
                line: Some(line),
                problem: Problem::LineTooLong,
            }));
        }
    }
}

fn read_some(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match input.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

enum Stop<E> {
    Bad(Problem, u64),
    Sink(E),
}

/// Parses whole lines (the last may lack its `\n` at the end of a file);
/// `line` is the number of the first and is left at the number of the next.
fn parse_lines<E>(
    bytes: &[u8],
    line: &mut u64,
    on_pair: &mut impl FnMut(u64, u32) -> Result<(), E>,
) -> Result<(), Stop<E>> {
    let mut pos = 0;
    while pos < bytes.len() {
        let start = pos;
        let parsed = parse_line(bytes, &mut pos);
        let end = if parsed.is_ok() {
            pos - usize::from(bytes[pos - 1] == b'\n')
        } else {
            memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |i| start + i)
        };
        if end - start > MAX_LINE {
            return Err(Stop::Bad(Problem::LineTooLong, *line));
        }
        match parsed {
            Ok(Some((vid, bit))) => on_pair(vid, bit).map_err(Stop::Sink)?,
            Ok(None) => {}
            Err(problem) => return Err(Stop::Bad(problem, *line)),
        }
        *line += 1;
    }
    Ok(())
}

fn skip_blanks(bytes: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t') = bytes.get(i) {
        i += 1;
    }
    i
}

/// The length of the line end at `i` (`\n`, `\r\n`, or the end of the
/// input), or `None` if the line goes on.
fn line_end(bytes: &[u8], i: usize) -> Option<usize> {
    match (bytes.get(i), bytes.get(i + 1)) {
        (None, _) => Some(0),
        (Some(b'\n'), _) => Some(1),
        (Some(b'\r'), None) => Some(1),
        (Some(b'\r'), Some(b'\n')) => Some(2),
        _ => None,
    }
}

/// Parses the line at `*pos`, leaving `*pos` after its end: the pair, or
/// `None` for a blank or comment line.
fn parse_line(bytes: &[u8], pos: &mut usize) -> Result<Option<(u64, u32)>, Problem> {
    let mut i = skip_blanks(bytes, *pos);
    if let Some(len) = line_end(bytes, i) {
        *pos = i + len;
        return Ok(None);
    }
    if bytes[i] == b'#' {
        *pos = memchr::memchr(b'\n', &bytes[i..]).map_or(bytes.len(), |n| i + n + 1);
        return Ok(None);
    }
    let vid = parse_field(bytes, &mut i, Field::Vid)?;
    i = skip_blanks(bytes, i);
    if bytes.get(i) != Some(&b',') {
        return Err(match line_end(bytes, i) {
            Some(_) => Problem::FieldCount { found: 1 },
            None => Problem::Unexpected {
                after: Field::Vid,
                text: rest_of_line(bytes, i),
            },
        });
    }
    i = skip_blanks(bytes, i + 1);
    let bit = parse_field(bytes, &mut i, Field::Bit)?;
    i = skip_blanks(bytes, i);
    match line_end(bytes, i) {
        Some(len) => *pos = i + len,
        None if bytes[i] == b',' => {
            let commas = bytes[..line_stop(bytes, i)].iter().skip(*pos);
            return Err(Problem::FieldCount {
                found: commas.filter(|&&c| c == b',').count() + 1,
            });
        }
        None => {
            return Err(Problem::Unexpected {
                after: Field::Bit,
                text: rest_of_line(bytes, i),
            });
        }
    }
    Ok(Some((vid, bit as u32)))
}

/// Where the line holding byte `i` ends (its `\n`, or the end of the input).
fn line_stop(bytes: &[u8], i: usize) -> usize {
    memchr::memchr(b'\n', &bytes[i..]).map_or(bytes.len(), |n| i + n)
}

fn rest_of_line(bytes: &[u8], i: usize) -> String {
    let end = line_stop(bytes, i);
    let text = &bytes[i..end];
    show(text.strip_suffix(b"\r").unwrap_or(text))
}

/// Parses a decimal field at `*i` and moves past it.
fn parse_field(bytes: &[u8], i: &mut usize, field: Field) -> Result<u64, Problem> {
    /// Up to 19 digits cannot overflow a `u64`.
    const SAFE_DIGITS: usize = 19;
    let start = *i;
    let mut value = 0u64;
    while let Some(&c) = bytes.get(*i) {
        let digit = c.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        value = value.wrapping_mul(10).wrapping_add(u64::from(digit));
        *i += 1;
    }
    let digits = *i - start;
    let delimited = matches!(
        bytes.get(*i),
        None | Some(b' ' | b'\t' | b',' | b'\n' | b'\r')
    );
    if delimited && (1..=SAFE_DIGITS).contains(&digits) && value <= field.max() {
        return Ok(value);
    }
    // Long runs of digits (leading zeros are allowed), and anything wrong:
    // the field's whole text, up to the next delimiter, decides.
    let end = start
        + bytes[start..]
            .iter()
            .position(|c| matches!(c, b' ' | b'\t' | b',' | b'\n' | b'\r'))
            .unwrap_or(bytes.len() - start);
    parse_decimal(&bytes[start..end], field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(text: &[u8]) -> Result<Vec<(u64, u32)>, (u64, String)> {
        let mut pairs = Vec::new();
        let mut line = 1;
        parse_lines(text, &mut line, &mut |vid, bit| {
            pairs.push((vid, bit));
            Ok::<(), ()>(())
        })
        .map(|()| pairs)
        .map_err(|e| match e {
            Stop::Bad(problem, line) => (line, problem.to_string()),
            Stop::Sink(()) => unreachable!("the sink never fails"),
        })
    }

    #[test]
    fn blanks_crlf_comments_and_a_missing_final_newline_are_accepted() {
        let text = b"1,2\n \t3 ,\t4 \r\n\n   \r\n# 5,6\n  #x\n18446744073709551615,4294967295";
        assert_eq!(
            parse_all(text).unwrap(),
            [(1, 2), (3, 4), (u64::MAX, u32::MAX)]
        );
    }

    #[test]
    fn each_malformed_line_gets_its_own_message() {
        let cases: &[(&[u8], &str)] = &[
            (b"abc,1", "vid \"abc\" is not a decimal number"),
            (b"12a,1", "vid \"12a\" is not a decimal number"),
            (b"-3,1", "vid -3 is negative"),
            (b"1,-3", "bit -3 is negative (bits are 0..=4294967295)"),
            (
                b"18446744073709551616,1",
                "vid 18446744073709551616 is out of range",
            ),
            (
                b"1,4294967296",
                "bit 4294967296 is out of range (bits are 0..=4294967295)",
            ),
            (b"1", "expected 2 fields \"vid,bit\", found 1"),
            (b"1,2,3", "expected 2 fields \"vid,bit\", found 3"),
            (b"1,2,3,4\r\n", "expected 2 fields \"vid,bit\", found 4"),
            (b",2", "the vid is empty"),
            (b"1,", "the bit is empty"),
            (b"1 2", "unexpected \"2\" after the vid"),
            (b"1,2 3\r\n", "unexpected \"3\" after the bit"),
            (b"1\r,2", "unexpected \"\\r,2\" after the vid"),
            (b"+1,2", "vid \"+1\" is not a decimal number"),
        ];
        for &(line, expected) in cases {
            let mut text = b"5,5\n# fine\n".to_vec();
            text.extend_from_slice(line);
            text.extend_from_slice(b"\n6,6\n");
            let (at, message) = parse_all(&text).unwrap_err();
            assert_eq!(at, 3, "{}", line.escape_ascii());
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        }
    }

    #[test]
    fn an_overlong_line_is_refused_whatever_it_holds() {
        let mut text = b"1,1\n".to_vec();
        text.extend(std::iter::repeat_n(b' ', MAX_LINE));
        text.extend_from_slice(b"2,2\n");
        assert_eq!(parse_all(&text).unwrap_err().0, 2);
        let mut bad = b"x".to_vec();
        bad.extend(std::iter::repeat_n(b'y', MAX_LINE));
        let (line, message) = parse_all(&bad).unwrap_err();
        assert_eq!(line, 1);
        assert!(message.contains("longer than"), "{message}");
    }
}
