//! Reading Cap'n Proto's stream framing (a segment table, then the
//! segments) into buffers that are never zeroed first.
//!
//! capnp-futures zeroes a whole message before reading into it: for a large
//! answer that is one more pass over every byte, on every hop. Here the
//! segments are read straight into a buffer's spare capacity, and the table
//! is checked before anything is allocated: a message announced over
//! [`MAX_MESSAGE_WORDS`] (or with more segments than Cap'n Proto reads) is
//! refused naming the bound, before its body is read, and the buffer grows
//! with the bytes that arrive rather than with what the table announced.
//! Cap'n Proto reads a segment only when it is 8-byte aligned; the buffer's
//! alignment is checked, and a misaligned one is copied once into words.
//!
//! A buffer of 32 MiB or more is mapped fresh by the allocator and costs a
//! page fault and a page clearing every 4 KiB as the bytes arrive: for an
//! answer of 2^30 bits, more than the work on it. A thread keeps the
//! large bodies it frees (at most two, none over 256 MiB) and reads its
//! next large message into one that holds it. That buffer is already this
//! thread's, so a peer's announced size still allocates nothing new.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::BufMut;
use capnp::Word;
use capnp::message::{Reader, ReaderOptions, ReaderSegments};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::MAX_MESSAGE_WORDS;

/// The most segments a message may have: Cap'n Proto's own reader refuses
/// 512 or more.
const MAX_SEGMENTS: usize = 511;

/// Bytes of a message's body reserved before any of it arrives. A peer's
/// table is believed only this far: one that announces a gigabyte and
/// sends nothing costs this much, not the gigabyte. A larger message's
/// buffer doubles as its bytes come in (the largest a query sends, a 2^26-bit
/// vector as words, fits without growing).
const FIRST_RESERVE: usize = 16 << 20;

/// A received message's segments, in one buffer.
pub struct Segments {
    /// Shared with the answers that keep their bytes ([`received`](super::received)).
    body: Arc<Body>,
    /// Where each segment ends, in words from the start of the body.
    ends: Vec<usize>,
}

/// The bytes of a message's segments, 8-byte aligned.
pub(super) enum Body {
    /// As read (the allocator returned aligned memory, as it does in practice).
    Read(Vec<u8>),
    /// Copied into words because the buffer read into was misaligned.
    Copied(Vec<Word>),
}

impl Body {
    /// `bytes` (whole words), copied into words.
    fn copied(bytes: &[u8]) -> Body {
        let mut words = Word::allocate_zeroed_vec(bytes.len() / 8);
        Word::words_to_bytes_mut(&mut words).copy_from_slice(bytes);
        Body::Copied(words)
    }

    /// The segments' bytes, one after the other.
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Body::Read(bytes) => bytes,
            Body::Copied(words) => Word::words_to_bytes(words),
        }
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if let Body::Read(bytes) = self
            && (SPARE_MIN..=SPARE_MAX).contains(&bytes.capacity())
        {
            let bytes = std::mem::take(bytes);
            // A thread that is ending drops the buffer instead.
            let _ = SPARES.try_with(|spares| {
                let mut spares = spares.borrow_mut();
                if spares.len() < SPARES_KEPT {
                    spares.push(bytes);
                }
            });
        }
    }
}

/// Buffers at least this large (glibc maps each one fresh and unmaps it
/// when freed) are kept for the next large message once read.
const SPARE_MIN: usize = 32 << 20;

/// Buffers larger than this (a 2^31-bit vector in words) are freed: what a
/// thread keeps stays bounded, at [`SPARES_KEPT`] of these.
const SPARE_MAX: usize = 256 << 20;

/// Large buffers a thread keeps at most (two queries in flight).
const SPARES_KEPT: usize = 2;

thread_local! {
    /// Large message buffers this thread freed, for its next large message:
    /// one of these already holds its pages, where a fresh one takes a page
    /// fault and a page clearing every 4 KiB.
    static SPARES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A spare buffer that holds `len` bytes, emptied, if this thread has one.
fn spare(len: usize) -> Option<Vec<u8>> {
    SPARES.with_borrow_mut(|spares| {
        let at = spares.iter().position(|b| b.capacity() >= len)?;
        let mut bytes = spares.swap_remove(at);
        bytes.clear();
        Some(bytes)
    })
}

impl ReaderSegments for Segments {
    fn get_segment(&self, id: u32) -> Option<&[u8]> {
        let id = usize::try_from(id).ok()?;
        let end = *self.ends.get(id)?;
        let start = match id {
            0 => 0,
            _ => self.ends[id - 1],
        };
        self.body.bytes().get(start * 8..end * 8)
    }

    fn len(&self) -> usize {
        self.ends.len()
    }
}

/// Reads the next message from `reader`; `None` when the stream ends
/// cleanly between messages.
pub async fn read_message<R: AsyncRead + Unpin>(
    reader: &mut R,
    options: ReaderOptions,
) -> capnp::Result<Option<Reader<Segments>>> {
    // The table's first word: the segment count less one, the first size.
    // It is read whole before the count is judged, as Cap'n Proto does: a
    // peer that sends a few bytes that are not Cap'n Proto (a TLS alert)
    // and closes reads as a stream cut short.
    let mut table = vec![0u8; 8];
    if !read_first(reader, &mut table).await? {
        return Ok(None);
    }
    let announced = u32::from_le_bytes(table[..4].try_into().expect("4 bytes"));
    let count = usize::try_from(announced)
        .ok()
        .and_then(|n| n.checked_add(1))
        .filter(|&n| n <= MAX_SEGMENTS)
        .ok_or_else(|| {
            capnp::Error::failed(format!(
                "{} segments in one message, more than the {MAX_SEGMENTS} allowed",
                u64::from(announced) + 1
            ))
        })?;
    // A size per segment, then padding to a whole word.
    table.resize((4 + 4 * count).next_multiple_of(8), 0);
    read_exact(reader, &mut table[8..]).await?;
    let mut ends = Vec::with_capacity(count);
    let mut words = 0u64;
    for size in table[4..].chunks_exact(4).take(count) {
        words += u64::from(u32::from_le_bytes(size.try_into().expect("4 bytes")));
        // Over usize only past the bound, which is refused below.
        ends.push(usize::try_from(words).unwrap_or(usize::MAX));
    }
    if words > MAX_MESSAGE_WORDS as u64 {
        return Err(capnp::Error::failed(format!(
            "{words} words in one message, more than the {MAX_MESSAGE_WORDS} allowed"
        )));
    }
    let len = usize::try_from(words * 8).expect("bounded by MAX_MESSAGE_WORDS");
    let kept = if len > FIRST_RESERVE {
        spare(len)
    } else {
        None
    };
    let mut bytes = kept.unwrap_or_else(|| Vec::with_capacity(len.min(FIRST_RESERVE)));
    while bytes.len() < len {
        if bytes.len() == bytes.capacity() {
            // Past FIRST_RESERVE the buffer doubles as the bytes arrive.
            bytes.reserve_exact((len - bytes.len()).min(bytes.capacity()));
        }
        let room = (len - bytes.len()).min(bytes.capacity() - bytes.len());
        if reader.read_buf(&mut (&mut bytes).limit(room)).await? == 0 {
            return Err(closed_mid_message());
        }
    }
    let body = Arc::new(match bytes.as_ptr() as usize % 8 {
        0 => Body::Read(bytes),
        _ => Body::copied(&bytes),
    });
    super::received::remember(&body);
    Ok(Some(Reader::new(Segments { body, ends }, options)))
}

/// Fills `first`; false if the stream ended cleanly before its first byte.
async fn read_first<R: AsyncRead + Unpin>(reader: &mut R, first: &mut [u8]) -> capnp::Result<bool> {
    let mut filled = 0;
    while filled < first.len() {
        match reader.read(&mut first[filled..]).await? {
            0 if filled == 0 => return Ok(false),
            0 => return Err(closed_mid_message()),
            n => filled += n,
        }
    }
    Ok(true)
}

async fn read_exact<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> capnp::Result<()> {
    match reader.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => Err(closed_mid_message()),
        Err(err) => Err(err.into()),
    }
}

/// The stream ended inside a message: a premature end of file, as
/// Cap'n Proto's own reader reports it.
fn closed_mid_message() -> capnp::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the connection closed in the middle of a message",
    )
    .into()
}

#[cfg(test)]
mod tests {
    use capnp::message::Builder;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    /// A framed message of `segments` segments of `words` words each.
    fn framed(segments: u32, words: u32) -> Vec<u8> {
        let mut bytes = (segments - 1).to_le_bytes().to_vec();
        for _ in 0..segments {
            bytes.extend(words.to_le_bytes());
        }
        if segments.is_multiple_of(2) {
            bytes.extend([0; 4]);
        }
        bytes.extend(vec![7u8; 8 * (segments * words) as usize]);
        bytes
    }

    /// A stream that hands out at most `chunk` bytes per read.
    struct Trickle<'a> {
        bytes: &'a [u8],
        chunk: usize,
    }

    impl AsyncRead for Trickle<'_> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = self.chunk.min(self.bytes.len()).min(buf.remaining());
            buf.put_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// Every message of `stream`, read `chunk` bytes at a time: their
    /// segments' bytes, or the error that stopped the reading.
    fn read_all(stream: &[u8], chunk: usize) -> capnp::Result<Vec<Vec<Vec<u8>>>> {
        runtime().block_on(async {
            let mut reader = Trickle {
                bytes: stream,
                chunk,
            };
            let mut messages = Vec::new();
            while let Some(message) = read_message(&mut reader, ReaderOptions::new()).await? {
                let segments = message.into_segments();
                messages.push(
                    (0..segments.len() as u32)
                        .map(|id| segments.get_segment(id).unwrap().to_vec())
                        .collect(),
                );
            }
            Ok(messages)
        })
    }

    #[test]
    fn messages_read_whole_however_the_stream_is_cut() {
        let shapes = [(1, 3), (2, 1), (1, 0), (3, 2), (4, 5)];
        let stream: Vec<u8> = shapes.iter().flat_map(|&(s, w)| framed(s, w)).collect();
        for chunk in [1, 3, 8, 13, 4096] {
            let messages = read_all(&stream, chunk).unwrap();
            let read: Vec<(u32, u32)> = messages
                .iter()
                .map(|segments| (segments.len() as u32, segments[0].len() as u32 / 8))
                .collect();
            assert_eq!(read, shapes, "chunk {chunk}");
            assert!(messages.iter().flatten().flatten().all(|&b| b == 7));
        }
    }

    #[test]
    fn a_message_over_the_first_reserve_reads_whole_as_its_bytes_arrive() {
        // Two segments, the second ending past FIRST_RESERVE by a few words.
        let first = 3u32;
        let second = (FIRST_RESERVE / 8) as u32 + 5;
        let mut stream = 1u32.to_le_bytes().to_vec();
        stream.extend(first.to_le_bytes());
        stream.extend(second.to_le_bytes());
        stream.extend([0; 4]);
        let body: Vec<u8> = (0..8 * (first + second) as usize)
            .map(|i| (i % 251) as u8)
            .collect();
        stream.extend(&body);
        stream.extend(framed(1, 2));
        for chunk in [1 << 20, 3 << 20] {
            let messages = read_all(&stream, chunk).unwrap();
            assert_eq!(messages.len(), 2, "chunk {chunk}");
            assert_eq!(messages[0][0], body[..8 * first as usize], "chunk {chunk}");
            assert!(
                messages[0][1] == body[8 * first as usize..],
                "chunk {chunk}"
            );
            assert_eq!(messages[1], vec![vec![7u8; 16]], "chunk {chunk}");
        }
    }

    /// The messages of `stream`, read on this thread.
    fn read_held(stream: &[u8]) -> Vec<Reader<Segments>> {
        runtime().block_on(async {
            let mut reader = stream;
            let mut held = Vec::new();
            while let Some(message) = read_message(&mut reader, ReaderOptions::new())
                .await
                .unwrap()
            {
                held.push(message);
            }
            held
        })
    }

    /// Where a message's body lies.
    fn body_at(message: &Reader<Segments>) -> *const u8 {
        message.get_segments().body.bytes().as_ptr()
    }

    /// Where this thread's spare buffers lie.
    fn spares_at() -> Vec<*const u8> {
        SPARES.with_borrow(|spares| spares.iter().map(|b| b.as_ptr()).collect())
    }

    #[test]
    fn a_large_body_once_dropped_is_read_into_again_and_few_are_kept() {
        let words = (SPARE_MIN / 8) as u32;
        drop(read_held(&framed(1, words)));
        let spare = spares_at();
        assert_eq!(spare.len(), 1, "a freed large body is kept");

        // A message over the first reserve that fits takes it; a small one
        // or a larger one does not.
        let fits = framed(1, (FIRST_RESERVE / 8) as u32 + 1);
        let held = read_held(&[fits, framed(1, 4), framed(1, words + 1)].concat());
        assert_eq!(body_at(&held[0]), spare[0]);
        assert_ne!(body_at(&held[1]), spare[0]);
        assert_ne!(body_at(&held[2]), spare[0]);
        assert!(spares_at().is_empty());
        drop(held);
        assert_eq!(spares_at().len(), 2, "both large bodies are kept");

        // Three large bodies alive at once: when they go, two are kept.
        drop(read_held(
            &[framed(1, words), framed(1, words), framed(1, words)].concat(),
        ));
        assert_eq!(spares_at().len(), SPARES_KEPT);
    }

    #[test]
    fn a_message_written_by_capnp_reads_back_equal() {
        let mut builder = Builder::new_default();
        let mut list = builder.initn_root::<capnp::primitive_list::Builder<'_, u64>>(5000);
        for i in 0..5000 {
            list.set(i, u64::from(i) * 0x9e37_79b9);
        }
        let mut stream = Vec::new();
        capnp::serialize::write_message(&mut stream, &builder).unwrap();
        stream.extend(&stream.clone());
        runtime().block_on(async {
            let mut reader = Trickle {
                bytes: &stream,
                chunk: 1000,
            };
            for _ in 0..2 {
                let message = read_message(&mut reader, ReaderOptions::new())
                    .await
                    .unwrap()
                    .unwrap();
                let list = message
                    .get_root::<capnp::primitive_list::Reader<'_, u64>>()
                    .unwrap();
                assert_eq!(list.len(), 5000);
                assert!((0..5000).all(|i| list.get(i) == u64::from(i) * 0x9e37_79b9));
            }
            let end = read_message(&mut reader, ReaderOptions::new())
                .await
                .unwrap();
            assert!(end.is_none(), "a clean end between messages");
        });
    }

    /// The copy a misaligned buffer gets (no allocator here returns one)
    /// holds the same segments, aligned.
    #[test]
    fn a_copied_body_serves_the_same_segments() {
        let bytes: Vec<u8> = (0..48).collect();
        let segments = Segments {
            body: Arc::new(Body::copied(&bytes[8..40])),
            ends: vec![1, 1, 4],
        };
        assert_eq!(segments.len(), 3);
        assert_eq!(segments.get_segment(0), Some(&bytes[8..16]));
        assert_eq!(segments.get_segment(1), Some(&[][..]));
        assert_eq!(segments.get_segment(2), Some(&bytes[16..40]));
        assert_eq!(segments.get_segment(3), None);
        let first = segments.get_segment(0).unwrap();
        assert_eq!(first.as_ptr() as usize % 8, 0);
    }

    #[test]
    fn a_message_announced_over_the_bound_is_refused_naming_it() {
        let mut stream = framed(2, 1);
        let over = MAX_MESSAGE_WORDS as u32 / 2 + 1;
        stream.extend(1u32.to_le_bytes());
        stream.extend(over.to_le_bytes());
        stream.extend(over.to_le_bytes());
        stream.extend([0; 4]);
        for chunk in [1, 5, 4096] {
            let err = read_all(&stream, chunk).unwrap_err();
            assert_eq!(
                err.extra,
                format!(
                    "{} words in one message, more than the {MAX_MESSAGE_WORDS} allowed",
                    2 * u64::from(over)
                )
            );
        }
    }

    #[test]
    fn too_many_segments_or_a_cut_message_are_refused() {
        let mut table = u32::MAX.to_le_bytes().to_vec();
        table.extend(1u32.to_le_bytes());
        let err = read_all(&table, 4096).unwrap_err();
        assert_eq!(
            err.extra,
            "4294967296 segments in one message, more than the 511 allowed"
        );
        let whole = framed(3, 2);
        // A TLS alert is 7 bytes: not even the table's first word.
        let alert = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x74];
        for cut in [
            &alert[..],
            &whole[..1],
            &whole[..5],
            &whole[..16],
            &whole[..whole.len() - 1],
        ] {
            let err = read_all(cut, 4096).unwrap_err();
            assert_eq!(err.kind, capnp::ErrorKind::PrematureEndOfFile, "{cut:?}");
            assert!(err.extra.contains("in the middle of a message"));
        }
    }
}
