//! bitfold's union, intersection and count side by side with roaring-rs and
//! the memory-bandwidth roof, over the same seeded vectors. Every benchmark of
//! a group reports the same throughput (bytes of the inputs in bitfold's
//! form), so throughput ratios are time ratios.
//!
//! `cargo bench -p bitfold-benches --bench kernels` (see benches/README.md;
//! `examples/interleaved.rs` measures the union groups round-robin, for
//! ratios that hold on a busy machine).

use std::hint::black_box;
use std::time::Duration;

use bitfold_benches::{DENSITIES, SHAPES, Workload, read_roof, read_roof_parallel, union};
use bitfold_engine::fold::{IntersectionPlan, Term, intersection_count};
use bitfold_engine::kernels::Kernels;
use bitfold_engine::{CONTAINER_WORDS, VectorBuf, VectorPart};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use roaring::MultiOps;

/// Output words a union's fill works on at a time (64 KiB).
const CHUNK_WORDS: usize = 8 * CONTAINER_WORDS;

/// Terms of the AND + count benchmarks.
const AND_TERMS: usize = 4;

fn configure(group: &mut BenchmarkGroup<'_, WallTime>, bytes: u64) {
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .throughput(Throughput::Bytes(bytes));
}

fn unions(c: &mut Criterion) {
    for (count, width) in SHAPES {
        for (seed, (label, density)) in DENSITIES.into_iter().enumerate() {
            let workload = Workload::new(count, width, density, seed as u64);
            let inputs = workload.parts();
            let mut out = vec![0u64; (1 << width) / 64];
            let mut group = c.benchmark_group(format!("union {count} x 2^{width} {label}"));
            configure(&mut group, workload.input_bytes());

            group.bench_function("bitfold UnionPlan", |b| {
                b.iter(|| union(black_box(&inputs), &mut out))
            });
            if inputs.iter().all(|p| p.sparse_keys().is_empty()) {
                // Every vector is dense over the same keys: the raw kernel
                // over whole vectors, one thread.
                let srcs: Vec<&[u64]> = inputs.iter().map(|p| p.dense_words()).collect();
                let kernels = Kernels::best();
                group.bench_function("multi-OR kernel, 1 thread", |b| {
                    b.iter(|| kernels.write_or(&mut out[..srcs[0].len()], black_box(&srcs)))
                });
                // The same, 64 KiB of output at a time, stopping where it is
                // all ones (as a union's fill does): no slower where it never is.
                group.bench_function("multi-OR until full, 1 thread", |b| {
                    b.iter(|| or_until_full(&kernels, &mut out[..srcs[0].len()], black_box(&srcs)))
                });
            }
            group.bench_function("roaring-rs union", |b| {
                b.iter(|| black_box(&workload.roaring).iter().union().len())
            });
            group.bench_function("roaring-rs intersection", |b| {
                b.iter(|| black_box(&workload.roaring).iter().intersection().len())
            });
            group.bench_function("read roof, 1 thread", |b| {
                b.iter(|| read_roof(black_box(&inputs)))
            });
            group.bench_function("read roof, 2 threads", |b| {
                b.iter(|| read_roof_parallel(black_box(&inputs)))
            });
            group.finish();
        }
    }
}

/// ORs `srcs` into `out` 64 KiB at a time with the kernel that stops where
/// a window is all ones; returns the sources read in all.
fn or_until_full(kernels: &Kernels, out: &mut [u64], srcs: &[&[u64]]) -> usize {
    let mut window: Vec<&[u64]> = Vec::with_capacity(srcs.len());
    let mut read = 0;
    for (i, chunk) in out.chunks_mut(CHUNK_WORDS).enumerate() {
        let start = i * CHUNK_WORDS;
        window.clear();
        window.extend(srcs.iter().map(|s| &s[start..start + chunk.len()]));
        read += kernels
            .write_or_until_full(chunk, &window)
            .unwrap_or(window.len());
    }
    read
}

fn and_counts(c: &mut Criterion) {
    for width in [20, 26] {
        for (seed, (label, density)) in DENSITIES.into_iter().enumerate() {
            let workload = Workload::new(AND_TERMS, width, density, 100 + seed as u64);
            let parts = workload.parts();
            let singles: Vec<[VectorPart<'_>; 1]> = parts.iter().map(|&p| [p]).collect();
            let terms: Vec<Term<'_, '_>> = singles
                .iter()
                .map(|p| Term::new(p).expect("one part"))
                .collect();
            let mut out = vec![0u64; (1 << width) / 64];
            let name = format!("and {AND_TERMS} x 2^{width} {label}");
            let mut group = c.benchmark_group(name);
            configure(&mut group, workload.input_bytes());

            group.bench_function("bitfold intersection_count", |b| {
                b.iter(|| intersection_count(black_box(&terms)))
            });
            group.bench_function("bitfold IntersectionPlan", |b| {
                b.iter(|| {
                    let plan = IntersectionPlan::new(black_box(&terms));
                    for (i, part) in plan.parts().iter().enumerate() {
                        plan.fill(i, &terms, &mut out[..part.dense_word_count()]);
                    }
                })
            });
            group.bench_function("roaring-rs intersection len", |b| {
                b.iter(|| black_box(&workload.roaring).iter().intersection().len())
            });
            group.bench_function("read roof, 1 thread", |b| {
                b.iter(|| read_roof(black_box(&parts)))
            });
            group.finish();
        }
    }
}

/// Where a sparse container should turn dense (`SPARSE_MAX`): the union
/// through `UnionPlan` of `n` vectors of 16 containers each holding `k`
/// bits, all sparse or all dense; 64 vectors' dense words fit in L3, 512
/// vectors' come from DRAM.
fn sparse_max(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(42);
    for count in [64, 512] {
        let mut group = c.benchmark_group(format!(
            "sparse or dense: {count} x 16 containers of k bits"
        ));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(800));
        for k in [128usize, 192, 256, 384, 512] {
            let (mut sparse, mut dense) = (Vec::new(), Vec::new());
            for _ in 0..count {
                let (mut s, mut d) = (VectorBuf::new(), VectorBuf::new());
                for key in 0..16u16 {
                    let mut lows: Vec<u16> = (0..k).map(|_| rng.random()).collect();
                    lows.sort_unstable();
                    lows.dedup();
                    let mut words = [0u64; CONTAINER_WORDS];
                    for &low in &lows {
                        words[usize::from(low) / 64] |= 1 << (low % 64);
                    }
                    s.push_sparse(key, &lows).expect("keys ascend");
                    d.push_dense(key, &words).expect("keys ascend");
                }
                sparse.push(s);
                dense.push(d);
            }
            let mut out = vec![0u64; 16 * CONTAINER_WORDS];
            for (form, vectors) in [("sparse", &sparse), ("dense", &dense)] {
                let inputs: Vec<VectorPart<'_>> = vectors.iter().map(VectorBuf::as_part).collect();
                group.bench_function(format!("k={k} {form}"), |b| {
                    b.iter(|| union(black_box(&inputs), &mut out))
                });
            }
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    // Plots cost more time than the measurements; the table is in README.md.
    config = Criterion::default().without_plots();
    targets = unions, and_counts, sparse_max
}
criterion_main!(benches);
