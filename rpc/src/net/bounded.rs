//! A connection's read half that checks each Cap'n Proto message's size,
//! as its segment table announces it, against [`MAX_MESSAGE_WORDS`] before
//! the message is read: a peer over the bound is told the bound, where
//! Cap'n Proto's own check (the reader options' traversal limit) names only
//! the size. The bytes pass through unchanged.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use super::MAX_MESSAGE_WORDS;

/// The most segments a message may have; Cap'n Proto refuses more itself,
/// so past it the stream is left to Cap'n Proto unwatched.
const MAX_SEGMENTS: usize = 512;

/// Where the reader is in the stream of messages.
#[derive(Debug)]
enum Frame {
    /// In a segment table: the bytes of it read so far.
    Table(Vec<u8>),
    /// In a message's segments: the bytes still to come.
    Body(u64),
    /// Past a table Cap'n Proto will refuse: nothing is checked any more.
    Unwatched,
}

/// Reads `inner`, refusing a message announced as over [`MAX_MESSAGE_WORDS`].
pub(super) struct Bounded<R> {
    inner: R,
    frame: Frame,
}

impl<R> Bounded<R> {
    pub(super) fn new(inner: R) -> Bounded<R> {
        Bounded {
            inner,
            frame: Frame::Table(Vec::new()),
        }
    }

    /// Follows `bytes`, the next bytes of the stream, through the framing.
    fn follow(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            match &mut self.frame {
                Frame::Unwatched => return Ok(()),
                Frame::Body(left) => {
                    let taken = bytes
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= taken as u64;
                    bytes = &bytes[taken..];
                    if *left == 0 {
                        self.frame = Frame::Table(Vec::new());
                    }
                }
                Frame::Table(table) => {
                    let wanted = table_len(table);
                    let taken = bytes.len().min(wanted - table.len());
                    table.extend_from_slice(&bytes[..taken]);
                    bytes = &bytes[taken..];
                    if table.len() == table_len(table) {
                        self.frame = match body_words(table) {
                            None => Frame::Unwatched,
                            Some(0) => Frame::Table(Vec::new()),
                            Some(words) if words > MAX_MESSAGE_WORDS as u64 => {
                                return Err(std::io::Error::new(
                                    std::io::ErrorKind::InvalidData,
                                    format!(
                                        "{words} words in one message, more than the \
                                         {MAX_MESSAGE_WORDS} allowed"
                                    ),
                                ));
                            }
                            Some(words) => Frame::Body(words * 8),
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

/// The length of the segment table `table` begins, once its first word
/// says how many segments follow (4 bytes until then).
fn table_len(table: &[u8]) -> usize {
    match segments(table) {
        // The count, a size per segment, padded to whole words.
        Some(n) if n <= MAX_SEGMENTS => (4 + 4 * n).next_multiple_of(8),
        _ => 4,
    }
}

fn segments(table: &[u8]) -> Option<usize> {
    let first: [u8; 4] = table.get(..4)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(first))
        .ok()?
        .checked_add(1)
}

/// The words of the segments a whole table announces; `None` for a table
/// of more segments than Cap'n Proto accepts.
fn body_words(table: &[u8]) -> Option<u64> {
    let n = segments(table).filter(|&n| n <= MAX_SEGMENTS)?;
    Some(
        table[4..4 + 4 * n]
            .chunks_exact(4)
            .map(|size| u64::from(u32::from_le_bytes(size.try_into().expect("4 bytes"))))
            .sum(),
    )
}

impl<R: AsyncRead + Unpin> AsyncRead for Bounded<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let fresh = &buf.filled()[before..];
            if let Err(err) = self.follow(fresh) {
                return Poll::Ready(Err(err));
            }
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// A message of `segments` segments of `words` words each, framed.
    fn message(segments: u32, words: u32) -> Vec<u8> {
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

    /// Reads all of `stream` through a [`Bounded`], `chunk` bytes at a time.
    fn read(stream: &[u8], chunk: usize) -> std::io::Result<Vec<u8>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut reader = Bounded::new(stream);
            let mut out = Vec::new();
            let mut buf = vec![0; chunk];
            loop {
                let n = reader.read(&mut buf).await?;
                if n == 0 {
                    return Ok(out);
                }
                out.extend_from_slice(&buf[..n]);
            }
        })
    }

    #[test]
    fn messages_within_the_bound_pass_unchanged_however_they_are_cut() {
        let mut stream = message(1, 3);
        stream.extend(message(2, 1));
        stream.extend(message(1, 0));
        stream.extend(message(3, 2));
        for chunk in [1, 3, 8, 13, 4096] {
            assert_eq!(read(&stream, chunk).unwrap(), stream, "chunk {chunk}");
        }
    }

    #[test]
    fn a_message_announced_over_the_bound_is_refused_naming_it() {
        let mut stream = message(2, 1);
        let over = MAX_MESSAGE_WORDS as u32 / 2 + 1;
        stream.extend(1u32.to_le_bytes());
        stream.extend(over.to_le_bytes());
        stream.extend(over.to_le_bytes());
        stream.extend([0; 4]);
        for chunk in [1, 5, 4096] {
            let err = read(&stream, chunk).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
            assert_eq!(
                err.to_string(),
                format!(
                    "{} words in one message, more than the {MAX_MESSAGE_WORDS} allowed",
                    2 * u64::from(over)
                )
            );
        }
    }
}
