//! The union workloads of `benches/kernels.rs`, measured round-robin: each
//! round runs every implementation once, so all of them see the same load,
//! and the ratios are medians of per-round ratios. On a machine shared with
//! other work this holds where criterion's one-benchmark-after-another
//! figures swing by a third. Before each run a 64 MiB buffer is read, so
//! that no implementation starts with the previous one's data in L3.
//!
//! `cargo run --release -p bitfold-benches --example interleaved [rounds]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use bitfold_benches::{
    DENSITIES, SHAPES, Workload, read_roof, read_roof_parallel, union, xor_reduce,
};
use bitfold_engine::kernels::Kernels;
use roaring::MultiOps;

const NAMES: [&str; 5] = [
    "bitfold UnionPlan",
    "multi-OR kernel, 1 thread",
    "roaring-rs union",
    "read roof, 1 thread",
    "read roof, 2 threads",
];

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse().expect("rounds is a number"))
        .unwrap_or(40);
    println!(
        "| union | bitfold UnionPlan | multi-OR kernel 1 thr | roaring-rs | roof 1 thr | roof 2 thr | roaring / bitfold | bitfold vs roof 2 thr | bitfold vs roof 1 thr |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (count, width) in SHAPES {
        for (seed, (label, density)) in DENSITIES.into_iter().enumerate() {
            let workload = Workload::new(count, width, density, seed as u64);
            let inputs = workload.parts();
            let srcs: Vec<&[u64]> = inputs.iter().map(|p| p.dense_words()).collect();
            let all_dense = inputs.iter().all(|p| p.sparse_keys().is_empty());
            let mut out = vec![0u64; (1 << width) / 64];
            let kernels = Kernels::best();
            let mut times = vec![Vec::new(); NAMES.len()];
            let evict = vec![1u64; 8 << 20];
            for round in 0..rounds {
                for step in 0..NAMES.len() {
                    // Rotate the order so no implementation always follows the same one.
                    let which = (step + round) % NAMES.len();
                    if which == 1 && !all_dense {
                        continue;
                    }
                    black_box(xor_reduce(&evict));
                    let start = Instant::now();
                    match which {
                        0 => {
                            black_box(union(&inputs, &mut out));
                        }
                        1 => kernels.write_or(&mut out[..srcs[0].len()], &srcs),
                        2 => {
                            black_box(workload.roaring.iter().union().len());
                        }
                        3 => {
                            black_box(read_roof(&inputs));
                        }
                        _ => {
                            black_box(read_roof_parallel(&inputs));
                        }
                    }
                    times[which].push(start.elapsed());
                }
            }
            let ratio = |a: usize, b: usize| {
                let mut r: Vec<f64> = times[a]
                    .iter()
                    .zip(&times[b])
                    .map(|(x, y)| x.as_secs_f64() / y.as_secs_f64())
                    .collect();
                median(&mut r)
            };
            let time = |i: usize| {
                if times[i].is_empty() {
                    return "—".to_string();
                }
                let mut t: Vec<f64> = times[i].iter().map(Duration::as_secs_f64).collect();
                let us = median(&mut t) * 1e6;
                if us >= 1000.0 {
                    format!("{:.2} ms", us / 1000.0)
                } else {
                    format!("{us:.1} µs")
                }
            };
            println!(
                "| {count} x 2^{width} {label} | {} | {} | {} | {} | {} | **{:.1}x** | {:.0}% | {:.0}% |",
                time(0),
                time(1),
                time(2),
                time(3),
                time(4),
                ratio(2, 0),
                100.0 * ratio(4, 0),
                100.0 * ratio(3, 0),
            );
        }
    }
}
