//! The portable Roaring serialization (RoaringFormatSpec), readable and
//! written by CRoaring, roaring-rs, pyroaring and Java's RoaringBitmap.
//!
//! Layout: a cookie (`12346` followed by the container count, or `12347` with
//! the count minus one in its high 16 bits followed by one bit per container
//! saying which are run containers), one `(key, cardinality - 1)` pair of
//! `u16` per container, a `u32` byte offset per container (always with
//! `12346`, with `12347` only from 4 containers on), then the containers:
//! arrays of `u16` (cardinality at most 4096), bitmaps of 1024 `u64`, or runs
//! (a `u16` run count, then `(start, length - 1)` pairs). Little-endian.
//!
//! [`read`] checks everything and never trusts a declared size before the
//! input is known to be that long. [`write()`] emits no run containers: arrays
//! up to 4096 bits, bitmaps above, as the spec requires.
//!
//! ```
//! use bitfold_engine::{portable, VectorBuf};
//!
//! let v = VectorBuf::from_bits(vec![1, 70_000, 1 << 31]);
//! let parts = [v.as_part()];
//! let mut bytes = vec![0; portable::serialized_size(&parts)];
//! portable::write(&parts, &mut bytes);
//! assert_eq!(portable::read(&bytes).unwrap(), v);
//! ```

use crate::vector::{CONTAINER_WORDS, ContainerRef, SPARSE_MAX, VectorBuf, VectorPart};

/// Cookie of a serialization without run containers (followed by a `u32` count).
pub const COOKIE_NO_RUNS: u32 = 12346;

/// Cookie (low 16 bits) of a serialization that may hold run containers.
pub const COOKIE_RUNS: u16 = 12347;

/// With [`COOKIE_RUNS`], the offset header is present from this many containers on.
const NO_OFFSET_THRESHOLD: usize = 4;

/// The largest cardinality stored as an array container; larger ones are bitmaps.
pub const ARRAY_MAX: usize = 4096;

/// The most containers a bitmap over 32-bit positions can have.
const MAX_CONTAINERS: usize = 1 << 16;

/// Bytes of a bitmap container.
const BITMAP_BYTES: usize = CONTAINER_WORDS * 8;

/// Why bytes are not a valid portable Roaring bitmap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a valid portable roaring bitmap: {problem} (at byte {offset})")]
pub struct PortableError {
    /// Byte offset in the input where the problem was found.
    pub offset: usize,
    /// What is wrong there.
    pub problem: String,
}

/// Reads bytes front to back, refusing to go past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn error(&self, problem: impl Into<String>) -> PortableError {
        PortableError {
            offset: self.pos,
            problem: problem.into(),
        }
    }

    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], PortableError> {
        let left = self.bytes.len() - self.pos;
        if len > left {
            return Err(self.error(format!(
                "the input ends {left} bytes into {what}, which needs {len} bytes"
            )));
        }
        let taken = &self.bytes[self.pos..self.pos + len];
        self.pos += len;
        Ok(taken)
    }

    fn u16(&mut self, what: &str) -> Result<u16, PortableError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, PortableError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn le16(bytes: &[u8], index: usize) -> u16 {
    u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]])
}

fn le32(bytes: &[u8], index: usize) -> u32 {
    let b = &bytes[4 * index..4 * index + 4];
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The container count, run flags and whether offsets follow, from the cookie.
struct Header<'a> {
    count: usize,
    run_flags: Option<&'a [u8]>,
    has_offsets: bool,
}

fn read_header<'a>(c: &mut Cursor<'a>) -> Result<Header<'a>, PortableError> {
    let cookie = c.u32("the cookie")?;
    if cookie == COOKIE_NO_RUNS {
        let count = c.u32("the container count")? as usize;
        if count > MAX_CONTAINERS {
            return Err(c.error(format!(
                "{count} containers declared, but a bitmap has at most {MAX_CONTAINERS}"
            )));
        }
        return Ok(Header {
            count,
            run_flags: None,
            has_offsets: true,
        });
    }
    if cookie & 0xffff == u32::from(COOKIE_RUNS) {
        let count = (cookie >> 16) as usize + 1;
        let run_flags = c.take(count.div_ceil(8), "the run container flags")?;
        return Ok(Header {
            count,
            run_flags: Some(run_flags),
            has_offsets: count >= NO_OFFSET_THRESHOLD,
        });
    }
    c.pos = 0;
    Err(c.error(format!(
        "unknown cookie {cookie:#010x} (expected {COOKIE_NO_RUNS}, or {COOKIE_RUNS} in the low 16 bits)"
    )))
}

/// Reads and fully validates a portable Roaring bitmap.
///
/// Checks the cookie, that the headers fit in the input before using the
/// counts they declare, that keys strictly ascend, that every offset points
/// where its container starts, that array values strictly ascend, that runs
/// ascend without overlapping or passing 65535, that every container holds
/// the cardinality its header declares, and that nothing follows the last
/// container. Memory grows only with the vector read (at most 512 MiB for a
/// vector holding every bit), never with a declared size.
pub fn read(bytes: &[u8]) -> Result<VectorBuf, PortableError> {
    let mut c = Cursor { bytes, pos: 0 };
    let header = read_header(&mut c)?;
    let descriptions = c.take(header.count * 4, "the container descriptions")?;
    let offsets = if header.has_offsets {
        Some(c.take(header.count * 4, "the container offsets")?)
    } else {
        None
    };
    let mut buf = VectorBuf::new();
    let mut positions: Vec<u16> = Vec::new();
    let mut words = vec![0u64; CONTAINER_WORDS];
    let mut last_key: Option<u16> = None;
    for i in 0..header.count {
        let key = le16(descriptions, 2 * i);
        let cardinality = usize::from(le16(descriptions, 2 * i + 1)) + 1;
        if let Some(last) = last_key.filter(|&last| last >= key) {
            return Err(c.error(format!(
                "container keys must strictly ascend, but key {key} follows key {last}"
            )));
        }
        last_key = Some(key);
        if let Some(offsets) = offsets {
            let declared = le32(offsets, i) as usize;
            if declared != c.pos {
                return Err(c.error(format!(
                    "the offset header puts container {i} (key {key}) at byte {declared}, but it starts here"
                )));
            }
        }
        let is_run = header
            .run_flags
            .is_some_and(|flags| flags[i / 8] >> (i % 8) & 1 == 1);
        let container = Container {
            key,
            cardinality,
            start: c.pos,
        };
        if is_run {
            read_runs(&mut c, container, &mut positions, &mut words, &mut buf)?;
        } else if cardinality <= ARRAY_MAX {
            let raw = c.take(2 * cardinality, "an array container")?;
            positions.clear();
            positions.extend(
                raw.chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]])),
            );
            if !positions.windows(2).all(|w| w[0] < w[1]) {
                return Err(container.error("array container values are not strictly ascending"));
            }
            buf.push_positions(key, &positions)
                .expect("keys ascend and positions were checked");
        } else {
            let raw = c.take(BITMAP_BYTES, "a bitmap container")?;
            for (word, b) in words.iter_mut().zip(raw.chunks_exact(8)) {
                *word = u64::from_le_bytes(b.try_into().expect("chunks of 8 bytes"));
            }
            container.check_cardinality(crate::kernels::popcount(&words) as usize)?;
            buf.push_dense(key, dense(&words))
                .expect("keys were checked to ascend");
        }
    }
    if c.pos != bytes.len() {
        return Err(c.error(format!(
            "{} bytes follow the last container",
            bytes.len() - c.pos
        )));
    }
    Ok(buf)
}

/// A container being read: its key, declared cardinality and first byte.
#[derive(Clone, Copy)]
struct Container {
    key: u16,
    cardinality: usize,
    start: usize,
}

impl Container {
    fn error(&self, problem: impl std::fmt::Display) -> PortableError {
        PortableError {
            offset: self.start,
            problem: format!("container with key {}: {problem}", self.key),
        }
    }

    fn check_cardinality(&self, actual: usize) -> Result<(), PortableError> {
        if actual == self.cardinality {
            return Ok(());
        }
        Err(self.error(format!(
            "holds {actual} bits but its header declares {}",
            self.cardinality
        )))
    }
}

fn dense(words: &[u64]) -> &[u64; CONTAINER_WORDS] {
    words
        .try_into()
        .expect("a container is CONTAINER_WORDS words")
}

fn read_runs(
    c: &mut Cursor<'_>,
    container: Container,
    positions: &mut Vec<u16>,
    words: &mut [u64],
    buf: &mut VectorBuf,
) -> Result<(), PortableError> {
    let run_count = usize::from(c.u16("a run container's run count")?);
    let raw = c.take(4 * run_count, "a run container's runs")?;
    let mut total = 0usize;
    let mut previous_end: Option<u32> = None;
    for i in 0..run_count {
        let start = u32::from(le16(raw, 2 * i));
        let end = start + u32::from(le16(raw, 2 * i + 1));
        if end > 0xffff {
            return Err(container.error(format!("run {i} goes past position 65535")));
        }
        // Runs are separated by at least one position, as every roaring
        // implementation writes them and the `roaring` crate requires.
        if let Some(p) = previous_end.filter(|&p| start <= p + 1) {
            return Err(container.error(format!(
                "run {i} starts at {start}, not after the previous run (ending at {p}) \
                 and a gap of at least one position"
            )));
        }
        previous_end = Some(end);
        total += (end - start + 1) as usize;
    }
    container.check_cardinality(total)?;
    let runs = raw.chunks_exact(4).map(|b| {
        (
            u16::from_le_bytes([b[0], b[1]]),
            u16::from_le_bytes([b[2], b[3]]),
        )
    });
    if total <= SPARSE_MAX {
        positions.clear();
        for (start, length) in runs {
            positions.extend(start..=start + length);
        }
        buf.push_sparse(container.key, positions)
            .expect("keys ascend and runs were checked");
    } else {
        words.fill(0);
        for (start, length) in runs {
            set_range(words, usize::from(start), usize::from(start + length));
        }
        buf.push_dense(container.key, dense(words))
            .expect("keys were checked to ascend");
    }
    Ok(())
}

/// Sets positions `first..=last` of a container's words.
fn set_range(words: &mut [u64], first: usize, last: usize) {
    let (first_word, last_word) = (first / 64, last / 64);
    let low_mask = u64::MAX << (first % 64);
    let high_mask = u64::MAX >> (63 - last % 64);
    if first_word == last_word {
        words[first_word] |= low_mask & high_mask;
        return;
    }
    words[first_word] |= low_mask;
    words[first_word + 1..last_word].fill(u64::MAX);
    words[last_word] |= high_mask;
}

/// The non-empty containers of key-disjoint ascending parts, with their cardinality.
fn containers<'p, 'a>(
    parts: &'p [VectorPart<'a>],
) -> impl Iterator<Item = (u16, ContainerRef<'a>, usize)> + 'p {
    parts.iter().flat_map(|part| {
        part.containers()
            .map(|(key, c)| (key, c, c.cardinality() as usize))
            .filter(|&(_, _, cardinality)| cardinality > 0)
    })
}

fn container_bytes(cardinality: usize) -> usize {
    if cardinality <= ARRAY_MAX {
        2 * cardinality
    } else {
        BITMAP_BYTES
    }
}

/// Bytes [`write()`] produces for the union of `parts`, which must be
/// key-disjoint and in ascending key order (as the parts of one vector are).
///
/// # Panics
///
/// If the parts overlap or are out of key order.
pub fn serialized_size(parts: &[VectorPart<'_>]) -> usize {
    let mut last: Option<u16> = None;
    let mut size = 8;
    for (key, _, cardinality) in containers(parts) {
        assert!(
            last.is_none_or(|l| l < key),
            "portable::serialized_size: parts must be key-disjoint and ascending"
        );
        last = Some(key);
        size += 8 + container_bytes(cardinality);
    }
    size
}

/// Writes the portable serialization of the union of `parts` (key-disjoint,
/// ascending) into `out`, which must be exactly [`serialized_size`] bytes.
///
/// Uses cookie [`COOKIE_NO_RUNS`] with the offset header; a container is an
/// array up to [`ARRAY_MAX`] bits and a bitmap above; all-zero containers
/// are left out.
///
/// # Panics
///
/// If `out` has the wrong length, or the parts overlap or are out of order.
pub fn write(parts: &[VectorPart<'_>], out: &mut [u8]) {
    assert_eq!(
        out.len(),
        serialized_size(parts),
        "portable::write: the output must be exactly serialized_size bytes"
    );
    let count = containers(parts).count();
    out[0..4].copy_from_slice(&COOKIE_NO_RUNS.to_le_bytes());
    out[4..8].copy_from_slice(&(count as u32).to_le_bytes());
    let (mut description, mut offset) = (8, 8 + 4 * count);
    let mut body = 8 + 8 * count;
    for (key, container, cardinality) in containers(parts) {
        out[description..description + 2].copy_from_slice(&key.to_le_bytes());
        out[description + 2..description + 4]
            .copy_from_slice(&((cardinality - 1) as u16).to_le_bytes());
        out[offset..offset + 4].copy_from_slice(&(body as u32).to_le_bytes());
        description += 4;
        offset += 4;
        let target = &mut out[body..body + container_bytes(cardinality)];
        if cardinality <= ARRAY_MAX {
            for (slot, low) in target.chunks_exact_mut(2).zip(container.positions()) {
                slot.copy_from_slice(&low.to_le_bytes());
            }
        } else {
            write_bitmap(container, target);
        }
        body += target.len();
    }
}

fn write_bitmap(container: ContainerRef<'_>, target: &mut [u8]) {
    match container {
        ContainerRef::Dense(words) => {
            for (slot, word) in target.chunks_exact_mut(8).zip(words.iter()) {
                slot.copy_from_slice(&word.to_le_bytes());
            }
        }
        ContainerRef::Sparse(values) => {
            target.fill(0);
            for &low in values {
                target[usize::from(low) / 8] |= 1 << (low % 8);
            }
        }
    }
}
