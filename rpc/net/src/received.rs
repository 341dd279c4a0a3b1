//! Large received messages, found again from a slice of their bytes, so an
//! answer keeps the buffer it arrived in instead of copying it out.
//!
//! capnp-rpc hands a response's fields out as borrowed slices and keeps the
//! message to itself. The reader ([`framing`](super::framing)) puts each
//! message body in an `Arc`; one of at least [`KEPT_MIN`] bytes is also
//! remembered here, weakly, by the thread that read it. The same thread,
//! holding a slice of such a body (a words answer of 8 MiB), gets a [`Bytes`]
//! that owns the body: one pass less over every byte of the answer.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Arc, Weak};

use bytes::Bytes;

use super::framing::Body;

/// Bodies at least this large are remembered (64 KiB): below it a copy
/// costs about what keeping the whole message does.
const KEPT_MIN: usize = 64 << 10;

thread_local! {
    /// The large bodies this thread read that may still be alive.
    static BODIES: RefCell<Vec<Weak<Body>>> = const { RefCell::new(Vec::new()) };
}

/// Remembers `body` (read on this thread) if it is large enough to be kept
/// by an answer, and forgets the bodies already dropped.
pub(super) fn remember(body: &Arc<Body>) {
    if body.bytes().len() < KEPT_MIN {
        return;
    }
    BODIES.with_borrow_mut(|bodies| {
        bodies.retain(|kept| kept.strong_count() > 0);
        bodies.push(Arc::downgrade(body));
    });
}

/// `bytes` as an owned [`Bytes`]: the received message they lie in, kept
/// alive without a copy, when this thread read it and it is still alive;
/// otherwise a copy.
pub fn keep(bytes: &[u8]) -> Bytes {
    if bytes.is_empty() {
        return Bytes::new();
    }
    let found = BODIES.with_borrow(|bodies| {
        bodies.iter().filter_map(Weak::upgrade).find_map(|body| {
            let within = within(body.bytes(), bytes)?;
            Some(Kept { body, within })
        })
    });
    match found {
        Some(kept) => Bytes::from_owner(kept),
        None => Bytes::copy_from_slice(bytes),
    }
}

/// Where `part` lies in `whole`, if it lies wholly inside it.
fn within(whole: &[u8], part: &[u8]) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then_some(start..end)
}

/// A slice of a received body, owning the body.
struct Kept {
    body: Arc<Body>,
    within: Range<usize>,
}

impl AsRef<[u8]> for Kept {
    fn as_ref(&self) -> &[u8] {
        &self.body.bytes()[self.within.clone()]
    }
}

#[cfg(test)]
mod tests {
    use capnp::message::{Builder, ReaderOptions};

    use super::*;
    use crate::framing::read_message;

    /// A message whose root is a data blob of `len` bytes, each its index mod 251.
    fn framed_blob(len: usize) -> (Vec<u8>, Vec<u8>) {
        let blob: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut message = Builder::new_default();
        message.set_root::<capnp::data::Owned>(&blob[..]).unwrap();
        let mut framed = Vec::new();
        capnp::serialize::write_message(&mut framed, &message).unwrap();
        (framed, blob)
    }

    fn read(framed: &[u8]) -> capnp::message::Reader<crate::framing::Segments> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut stream = framed;
        runtime
            .block_on(read_message(&mut stream, ReaderOptions::new()))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn a_large_answer_keeps_the_bytes_it_arrived_in() {
        let (framed, blob) = framed_blob(KEPT_MIN + 8);
        let message = read(&framed);
        let data: capnp::data::Reader<'_> = message.get_root().unwrap();
        let kept = keep(data);
        assert_eq!(kept.as_ptr(), data.as_ptr(), "copied, not kept");
        drop(message);
        assert_eq!(kept, blob, "the bytes outlive the message");
    }

    #[test]
    fn a_small_answer_or_foreign_bytes_are_copied() {
        let (framed, blob) = framed_blob(KEPT_MIN / 2);
        let message = read(&framed);
        let data: capnp::data::Reader<'_> = message.get_root().unwrap();
        let copied = keep(data);
        assert_ne!(copied.as_ptr(), data.as_ptr());
        assert_eq!(copied, blob);
        let foreign = vec![5u8; KEPT_MIN * 2];
        let copied = keep(&foreign);
        assert_ne!(copied.as_ptr(), foreign.as_ptr());
        assert_eq!(copied, foreign);
        assert!(keep(&[]).is_empty());
    }

    #[test]
    fn another_thread_copies() {
        let (framed, blob) = framed_blob(KEPT_MIN + 8);
        let message = read(&framed);
        let data: capnp::data::Reader<'_> = message.get_root().unwrap();
        let copied = std::thread::scope(|scope| scope.spawn(|| keep(data)).join().unwrap());
        assert_ne!(copied.as_ptr(), data.as_ptr());
        assert_eq!(copied, blob);
    }

    #[test]
    fn a_slice_must_lie_wholly_inside() {
        let whole = [0u8; 64];
        assert_eq!(within(&whole, &whole[8..24]), Some(8..24));
        assert_eq!(within(&whole, &whole[..]), Some(0..64));
        assert_eq!(within(&whole[8..], &whole[..16]), None);
        assert_eq!(within(&whole[..32], &whole[16..48]), None);
    }
}
