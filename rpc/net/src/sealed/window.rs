//! The buffers of a TLS connection: bytes at the front wait to be used,
//! room after them takes more.

use tokio::io::ReadBuf;

/// Bytes at `start..end` of `bytes` wait to be used; the rest is room.
#[derive(Default)]
pub(super) struct Window {
    pub(super) bytes: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
}

impl Window {
    /// An empty window over `len` bytes, allocated now.
    pub(super) fn with_len(len: usize) -> Window {
        Window {
            bytes: vec![0; len],
            ..Window::default()
        }
    }

    pub(super) fn pending(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    pub(super) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Bytes of room after the pending ones, as the buffer is.
    pub(super) fn spare(&self) -> usize {
        self.bytes.len() - self.end
    }

    /// Counts `n` pending bytes as used.
    pub(super) fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Moves the pending bytes to the front.
    pub(super) fn compact(&mut self) {
        if self.start > 0 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// At least `n` bytes of room after the pending ones, moving them to
    /// the front or growing the buffer when needed.
    pub(super) fn room(&mut self, n: usize) -> &mut [u8] {
        if self.spare() < n {
            self.compact();
        }
        if self.spare() < n {
            self.bytes.resize(self.end + n, 0);
        }
        &mut self.bytes[self.end..]
    }

    /// Copies as much of the pending bytes as fits into `dest`.
    pub(super) fn take_into(&mut self, dest: &mut ReadBuf<'_>) {
        let n = dest.remaining().min(self.end - self.start);
        dest.put_slice(&self.bytes[self.start..self.start + n]);
        self.consume(n);
    }

    /// Appends `bytes`.
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.room(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }
}
