//! How many buffers a 128 KiB partial result fills per hop of a chain.
//!
//! A counting allocator counts every allocation of 100 KiB and more while a
//! `count` query runs over chains of 1 to 4 machines (everything else in
//! the query is far smaller). Each such buffer is written once: by the
//! fold, by a socket read, or by a copy. The difference between chains of
//! `k + 1` and `k` machines is the cost of one hop:
//!
//! - forward: the fold fills the request to the next machine in place (1),
//!   the next machine reads it from its socket (1) and folds from it in place;
//! - return: the reply is read from the socket (1) and copied into this
//!   machine's own reply (1), capnp-rpc having no tail calls.
//!
//! So 4 buffers per hop, of which 3 are copies of the partial result (one
//! read each way and the return-path copy) and one is the OR itself. A
//! chain that ends on the coordinator fills a buffer the coordinator's
//! thread keeps between queries, not a new one.
//!
//! The fan-out plan moves each machine's partial result once, straight to
//! the coordinator: 2 buffers per extra machine (its OR, filled in place
//! into its reply, and the coordinator's socket read).
//!
//! A partial result that is all ones travels as its container keys alone:
//! no big buffer at all.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bitfold_client::{Answer, Format};
use bitfold_engine::VectorBuf;
use bitfold_server::master::PlanChoice;
use bitfold_server::placement;
use common::TestCluster;

const BIG: usize = 100 << 10;

static BIG_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

struct Counting;

// SAFETY: every call is passed straight to the system allocator with the
// same arguments; the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= BIG {
            BIG_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract for `alloc` is forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= BIG {
            BIG_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract for `alloc_zeroed` is forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= BIG && layout.size() < BIG {
            BIG_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract for `realloc` is forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Buffers of 100 KiB and more filled by a count query over 1..=4 machines
/// under `plan`, each vector's words all `word`, and their differences (the
/// cost of one more machine).
fn buffers_per_machine(plan: PlanChoice, word: u64) -> (Vec<u64>, Vec<u64>) {
    // The counter is process-wide: one measurement at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = TestCluster::start_with(4, 1, |o| {
        o.policy = "bandwidth".parse().unwrap();
        o.plan = plan;
    });
    let client = cluster.client();
    // One vid on each slave, ascending; each vector is 16 dense containers
    // (128 KiB) of the same words over the same keys, so every partial
    // result is 128 KiB too (unless all ones).
    let mut vids: Vec<u64> = (0..4)
        .map(|slave| (0..).find(|&v| placement::primary(v, 4) == slave).unwrap())
        .collect();
    vids.sort_unstable();
    let mut vector = VectorBuf::new();
    for key in 0..16 {
        vector.push_dense(key, &[word; 1024]).unwrap();
    }
    let batch: Vec<_> = vids.iter().map(|&v| (v, vector.as_part())).collect();
    client.import(&batch).unwrap();

    let mut buffers = Vec::new();
    for machines in 1..=4 {
        // R:first-last over `machines` vids on as many slaves: one chain
        // through all of them, started on the coordinator (the bandwidth
        // policy picks the lowest-numbered holder, the chain's head).
        let message = format!("R:{}-{}", vids[0], vids[machines - 1]);
        client.query(&message, Format::Count).unwrap();
        let before = BIG_ALLOCATIONS.load(Ordering::Relaxed);
        let answer = client.query(&message, Format::Count).unwrap();
        buffers.push(BIG_ALLOCATIONS.load(Ordering::Relaxed) - before);
        assert_eq!(
            answer,
            Answer::Count(16 * 1024 * u64::from(word.count_ones()))
        );
    }
    let per_hop: Vec<u64> = buffers.windows(2).map(|w| w[1] - w[0]).collect();
    println!(
        "{plan} plan: buffers of 100 KiB+ per query over 1..=4 machines: {buffers:?}; \
         per machine: {per_hop:?}"
    );
    (buffers, per_hop)
}

#[test]
fn a_hop_fills_four_buffers_of_the_partial_result() {
    let (buffers, per_hop) = buffers_per_machine(PlanChoice::Chain, 0x5555_5555_5555_5555);
    // A chain that ends on the coordinator keeps its vector in a buffer the
    // thread kept from the query before: no new one.
    assert_eq!(buffers[0], 0, "{buffers:?}");
    assert!(per_hop.iter().all(|&n| n == per_hop[0]), "{per_hop:?}");
    assert!(per_hop[0] <= 4, "a hop fills {} buffers", per_hop[0]);
}

#[test]
fn a_fan_out_fills_two_buffers_per_machine() {
    let (buffers, per_machine) = buffers_per_machine(PlanChoice::FanOut, 0x5555_5555_5555_5555);
    assert_eq!(per_machine, [2, 2, 2], "buffers per query: {buffers:?}");
}

#[test]
fn a_partial_result_of_all_ones_fills_no_buffer() {
    for plan in [PlanChoice::Chain, PlanChoice::FanOut] {
        let (buffers, _) = buffers_per_machine(plan, u64::MAX);
        assert_eq!(buffers, [0, 0, 0, 0], "{plan} plan");
    }
}
