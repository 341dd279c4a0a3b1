//! Grouping pairs into vectors a batch at a time ([`PairBatcher`]).

use std::collections::HashMap;

use rayon::prelude::*;

use crate::vector::VectorBuf;

/// Hashes vids cheaply: a keyed 64-bit finaliser (murmur3's fmix64) instead
/// of SipHash, which took most of the time of batching pairs. The key is
/// random per process, so an input cannot be crafted to collide.
#[derive(Clone, Copy)]
struct VidHash {
    key: u64,
}

impl Default for VidHash {
    fn default() -> Self {
        use std::hash::BuildHasher;
        VidHash {
            key: std::hash::RandomState::new().hash_one(0u64),
        }
    }
}

impl std::hash::BuildHasher for VidHash {
    type Hasher = VidHasher;

    fn build_hasher(&self) -> VidHasher {
        VidHasher(self.key)
    }
}

/// The hasher of [`VidHash`]; only ever fed one `u64`.
struct VidHasher(u64);

impl std::hash::Hasher for VidHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, vid: u64) {
        self.0 = crate::mix::fmix64(self.0 ^ vid);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Pairs gathered until a batch is full, then grouped per vid.
///
/// Each pair is appended to one flat list as `(slot, bit)`, where the slot
/// numbers the vids of the batch; grouping happens once per batch with a
/// counting sort. Appending to a per-vid `Vec` instead spent most of its
/// time on cache misses, the input being in no particular vid order.
#[derive(Default)]
pub(super) struct PairBatcher {
    slot_of: HashMap<u64, u32, VidHash>,
    /// The vid of each slot.
    vids: Vec<u64>,
    /// Pairs per slot.
    counts: Vec<usize>,
    /// `slot << 32 | bit`, in input order.
    pairs: Vec<u64>,
    /// The previous pair's vid and slot: input is often grouped by vid.
    last: Option<(u64, u32)>,
}

impl PairBatcher {
    /// Adds a pair; returns the number of pairs now pending.
    pub(super) fn add(&mut self, vid: u64, bit: u32) -> usize {
        let slot = match self.last {
            Some((last, slot)) if last == vid => slot,
            _ => {
                let next = self.vids.len() as u32;
                let slot = *self.slot_of.entry(vid).or_insert(next);
                if slot == next {
                    self.vids.push(vid);
                    self.counts.push(0);
                }
                self.last = Some((vid, slot));
                slot
            }
        };
        self.counts[slot as usize] += 1;
        self.pairs.push(u64::from(slot) << 32 | u64::from(bit));
        self.pairs.len()
    }

    pub(super) fn pending(&self) -> usize {
        self.pairs.len()
    }

    /// The pending vectors, ascending by vid; the batcher is left empty.
    pub(super) fn take(&mut self) -> Vec<(u64, VectorBuf)> {
        let mut next = Vec::with_capacity(self.counts.len());
        let mut start = 0;
        for &count in &self.counts {
            next.push(start);
            start += count;
        }
        let mut bits = vec![0u32; self.pairs.len()];
        for &pair in &self.pairs {
            let slot = (pair >> 32) as usize;
            bits[next[slot]] = pair as u32;
            next[slot] += 1;
        }
        let mut groups: Vec<(u64, &mut [u32])> = Vec::with_capacity(self.vids.len());
        let mut rest = &mut bits[..];
        for (&vid, &count) in self.vids.iter().zip(&self.counts) {
            let (group, tail) = rest.split_at_mut(count);
            groups.push((vid, group));
            rest = tail;
        }
        groups.sort_unstable_by_key(|(vid, _)| *vid);
        let vectors = groups
            .into_par_iter()
            .map(|(vid, group)| {
                group.sort_unstable();
                let len = dedup_sorted(group);
                (vid, VectorBuf::from_sorted_bits(&group[..len]))
            })
            .collect();
        self.slot_of.clear();
        self.vids.clear();
        self.counts.clear();
        self.pairs.clear();
        self.last = None;
        vectors
    }
}

/// Moves the distinct values of sorted `values` to its front; returns how many.
fn dedup_sorted(values: &mut [u32]) -> usize {
    let mut len = 0;
    for i in 0..values.len() {
        if len == 0 || values[i] != values[len - 1] {
            values[len] = values[i];
            len += 1;
        }
    }
    len
}
