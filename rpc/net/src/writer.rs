//! A connection's write buffer that gathers small writes and sends a large
//! one from where it is.
//!
//! capnp writes a message as its segment table, then each segment. Small
//! pieces are copied into the buffer, so a small message leaves in one
//! send. A piece of at least [`DIRECT`] bytes (a partial result's data
//! segment) is not copied: it leaves in one vectored write together with
//! what the buffer holds, so a large message also costs one send, and one
//! wake-up of the peer, without a pass over its bytes.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::AsyncWrite;

/// The smallest write sent from where it is rather than copied.
const DIRECT: usize = 16 << 10;

/// Writes to `inner` through a buffer of up to `capacity` bytes.
pub(super) struct WriteBuffer<W> {
    inner: W,
    buffer: Vec<u8>,
    /// Bytes at the buffer's front already written.
    written: usize,
}

impl<W: AsyncWrite + Unpin> WriteBuffer<W> {
    pub(super) fn new(capacity: usize, inner: W) -> WriteBuffer<W> {
        WriteBuffer {
            inner,
            buffer: Vec::with_capacity(capacity),
            written: 0,
        }
    }

    /// Writes everything buffered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while !self.buffer.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buffer[self.written..]))?;
            self.advance(n)?;
        }
        Poll::Ready(Ok(()))
    }

    /// Counts `n` more buffered bytes as written; once all are, the buffer
    /// is empty again.
    fn advance(&mut self, n: usize) -> std::io::Result<()> {
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        self.written += n;
        if self.written == self.buffer.len() {
            self.buffer.clear();
            self.written = 0;
        }
        Ok(())
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for WriteBuffer<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if buf.len() < DIRECT {
            if this.buffer.len() + buf.len() > this.buffer.capacity() {
                ready!(this.poll_drain(cx))?;
            }
            this.buffer.extend_from_slice(buf);
            return Poll::Ready(Ok(buf.len()));
        }
        // What is buffered goes first, in the same call where it can.
        while !this.buffer.is_empty() {
            let pending = this.buffer.len() - this.written;
            let slices = [
                IoSlice::new(&this.buffer[this.written..]),
                IoSlice::new(buf),
            ];
            let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, &slices))?;
            this.advance(n.min(pending))?;
            if n > pending {
                return Poll::Ready(Ok(n - pending));
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use futures::AsyncWriteExt;

    use super::*;

    /// A sink that takes at most `chunk` bytes per call, and counts calls.
    #[derive(Default)]
    struct Sink {
        bytes: Vec<u8>,
        chunk: usize,
        calls: usize,
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            slices: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            this.calls += 1;
            let mut left = this.chunk;
            for slice in slices {
                let n = left.min(slice.len());
                this.bytes.extend_from_slice(&slice[..n]);
                left -= n;
            }
            Poll::Ready(Ok(this.chunk - left))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Writes `pieces` then flushes, through a 64 KiB buffer over a sink
    /// taking `chunk` bytes a call; returns the sink.
    fn write(pieces: &[Vec<u8>], chunk: usize) -> Sink {
        futures::executor::block_on(async {
            let mut writer = WriteBuffer::new(
                64 << 10,
                Sink {
                    chunk,
                    ..Sink::default()
                },
            );
            for piece in pieces {
                writer.write_all(piece).await.unwrap();
            }
            writer.flush().await.unwrap();
            writer.inner
        })
    }

    fn pieces() -> Vec<Vec<u8>> {
        [8, 16, 100, 40 << 10, 8, 128 << 10, 3, 50 << 10, 50 << 10, 7]
            .iter()
            .enumerate()
            .map(|(i, &len)| (0..len).map(|b| (b * 31 + i) as u8).collect())
            .collect()
    }

    #[test]
    fn every_byte_arrives_in_order_however_little_each_call_takes() {
        let pieces = pieces();
        let all: Vec<u8> = pieces.concat();
        for chunk in [1, 7, 4096, 100 << 10, 1 << 30] {
            assert_eq!(write(&pieces, chunk).bytes, all, "chunk {chunk}");
        }
    }

    #[test]
    fn a_message_with_a_large_segment_leaves_in_one_call() {
        let table = vec![1u8; 16];
        let first = vec![2u8; 200];
        let data = vec![3u8; 128 << 10];
        let sink = write(&[table.clone(), first.clone(), data.clone()], 1 << 30);
        assert_eq!(sink.calls, 1);
        assert_eq!(sink.bytes, [table, first, data].concat());
    }
}
