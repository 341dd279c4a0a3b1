//! Word buffers a thread keeps between folds.
//!
//! A fold fills its dense output into a buffer of words. A fresh buffer's
//! pages are zero-filled by the kernel on first touch, a cost that can
//! dominate a small fold, so a fold that needs a buffer only for a while
//! takes one from its thread's pool and gives it back when done: a
//! [`KeptWords`] goes back to the pool of the thread that drops it. Each
//! buffer keeps its length as it was, since a fill overwrites every word it
//! uses ([`UnionPlan::fill_all`](super::UnionPlan::fill_all) zeroes only
//! growth).

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

use crate::vector::CONTAINER_WORDS;

/// Buffers a thread keeps (a query ANDs a few terms, each a buffer).
const KEEP_BUFFERS: usize = 8;

/// The largest buffer a thread keeps (256 KiB, two 2^20-bit vectors): a
/// larger one is freed, so that a thread holds at most 2 MiB this way.
const KEEP_MAX_WORDS: usize = 32 * CONTAINER_WORDS;

thread_local! {
    static POOL: RefCell<Vec<Vec<u64>>> = const { RefCell::new(Vec::new()) };
}

/// A word buffer from this thread's pool, given back when dropped.
#[derive(Debug, Default)]
pub struct KeptWords(Vec<u64>);

impl KeptWords {
    /// A buffer from this thread's pool (or a new, empty one), its length
    /// and contents as the last user left them.
    pub fn take() -> KeptWords {
        KeptWords(POOL.with_borrow_mut(Vec::pop).unwrap_or_default())
    }

    /// A buffer from this thread's pool, `len` words of zero.
    pub fn zeroed(len: usize) -> KeptWords {
        let mut kept = KeptWords::take();
        kept.0.clear();
        kept.0.resize(len, 0);
        kept
    }

    /// How many buffers this thread's pool holds now.
    pub fn pooled() -> usize {
        POOL.with_borrow(Vec::len)
    }
}

impl Deref for KeptWords {
    type Target = Vec<u64>;

    fn deref(&self) -> &Vec<u64> {
        &self.0
    }
}

impl DerefMut for KeptWords {
    fn deref_mut(&mut self) -> &mut Vec<u64> {
        &mut self.0
    }
}

impl Drop for KeptWords {
    fn drop(&mut self) {
        let words = std::mem::take(&mut self.0);
        if words.capacity() == 0 || words.capacity() > KEEP_MAX_WORDS {
            return;
        }
        // A thread being torn down has no pool left: the buffer is freed.
        let _ = POOL.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            if pool.len() < KEEP_BUFFERS {
                pool.push(words);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_pool() {
        POOL.with_borrow_mut(Vec::clear);
    }

    #[test]
    fn a_dropped_buffer_is_taken_again_with_its_words() {
        empty_pool();
        let mut kept = KeptWords::take();
        assert!(kept.is_empty());
        kept.extend([7, 8, 9]);
        let buffer = kept.as_ptr();
        drop(kept);
        assert_eq!(KeptWords::pooled(), 1);
        let again = KeptWords::take();
        assert_eq!(again.as_ptr(), buffer, "the buffer is reused");
        assert_eq!(*again, [7, 8, 9], "its words are as they were left");
        assert_eq!(KeptWords::pooled(), 0, "a taken buffer leaves the pool");
        drop(again);
        let zeroed = KeptWords::zeroed(3);
        assert_eq!(zeroed.as_ptr(), buffer);
        assert_eq!(*zeroed, [0; 3]);
    }

    #[test]
    fn large_buffers_and_buffers_past_the_count_are_freed() {
        empty_pool();
        drop(KeptWords::zeroed(KEEP_MAX_WORDS + 1));
        assert_eq!(KeptWords::pooled(), 0, "a large buffer is not kept");
        drop(KeptWords::take());
        assert_eq!(KeptWords::pooled(), 0, "an empty buffer is not kept");
        let held: Vec<KeptWords> = (0..KEEP_BUFFERS + 3)
            .map(|_| KeptWords::zeroed(16))
            .collect();
        drop(held);
        assert_eq!(KeptWords::pooled(), KEEP_BUFFERS);
    }

    #[test]
    fn a_buffer_returns_to_the_pool_of_the_thread_that_drops_it() {
        empty_pool();
        let kept = std::thread::spawn(|| KeptWords::zeroed(16)).join().unwrap();
        assert_eq!(KeptWords::pooled(), 0);
        drop(kept);
        assert_eq!(KeptWords::pooled(), 1);
    }
}
