//! What small pages cost a read of vectors from a memory-mapped file, and
//! whether this machine maps a store's segment files in huge pages.
//!
//! Writes the same bytes twice into a store directory: once the way a store
//! wrote its files before it wrote whole chunks (a 1 MiB `BufWriter` fed
//! 128 KiB at a time), once through the store's own writer (`MmapDirectory::create`,
//! whole aligned 2 MiB chunks). Maps both through the store, reports how
//! much of each map the kernel backs with huge pages (`FilePmdMapped` in
//! `/proc/self/smaps`), then ORs 128 KiB slices at random places, as a
//! range query reads vectors, one map and then the other, round after
//! round; the figures are medians over rounds. The files go in a
//! temporary directory under the current one: run it where a store's data
//! would live (the file system decides what the kernel can do).
//!
//! `cargo run --release -p bitfold-benches --example hugepages [MiB] [rounds]`

use std::io::{BufWriter, Write};
use std::time::Instant;

use bitfold_engine::kernels::Kernels;
use bitfold_engine::store::{Directory, FileBytes, MmapDirectory};
use rand::{Rng, RngCore, SeedableRng};

/// Bytes of one vector of 2^20 bits.
const VECTOR: usize = 128 << 10;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(Ok(1024), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    anyhow::ensure!(
        mib >= 2 && rounds > 0,
        "MiB must be 2 or more, rounds positive"
    );
    let size = mib << 20;

    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let store = MmapDirectory::open(dir.path())?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut bytes = vec![0u8; size];
    rng.fill_bytes(&mut bytes);

    let mut old = BufWriter::with_capacity(1 << 20, std::fs::File::create(store.path("small"))?);
    for slice in bytes.chunks(VECTOR) {
        old.write_all(slice)?;
    }
    old.into_inner()?.sync_all()?;
    let mut new = store.create("chunked")?;
    for slice in bytes.chunks(VECTOR) {
        new.write_all(slice)?;
    }
    new.commit()?;
    drop(bytes);

    let maps = [
        ("1 MiB BufWriter", store.read("small")?),
        ("store's writer ", store.read("chunked")?),
    ];
    let kernels = Kernels::best();
    let vectors = size / VECTOR;
    let order: Vec<usize> = (0..vectors * 2)
        .map(|_| rng.random_range(0..vectors))
        .collect();
    let mut speeds = vec![Vec::new(); maps.len()];
    for _ in 0..rounds {
        for (speed, (_, map)) in speeds.iter_mut().zip(&maps) {
            speed.push(or_speed(&kernels, map, &order));
        }
    }
    println!(
        "{mib} MiB, {} random 128 KiB reads a round, {rounds} rounds",
        order.len()
    );
    for (speed, (name, map)) in speeds.iter_mut().zip(&maps) {
        speed.sort_by(f64::total_cmp);
        println!(
            "  {name}: {:>7} kB of {:>7} in huge pages, OR {:.2} GB/s (median; {:.2}-{:.2})",
            huge_kb(map)?,
            map.len() >> 10,
            speed[speed.len() / 2],
            speed[0],
            speed[speed.len() - 1],
        );
    }
    Ok(())
}

/// GB/s of ORing the vectors of `map` named by `order` into one buffer.
fn or_speed(kernels: &Kernels, map: &FileBytes, order: &[usize]) -> f64 {
    let words: &[u64] = bytemuck::cast_slice(map);
    let per = VECTOR / 8;
    let mut acc = vec![0u64; per];
    let start = Instant::now();
    for &v in order {
        kernels.or_into(&mut acc, &words[v * per..(v + 1) * per]);
    }
    let seconds = start.elapsed().as_secs_f64();
    std::hint::black_box(&acc);
    (order.len() * VECTOR) as f64 / seconds / 1e9
}

/// `FilePmdMapped` of the mapping that holds `map`, in kB (0 where the
/// kernel does not say).
fn huge_kb(map: &FileBytes) -> anyhow::Result<u64> {
    let at = map.as_ptr() as u64;
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((lo, hi)) = range.split_once('-')
            && let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
        {
            inside = (lo..hi).contains(&at);
        } else if inside && let Some(kb) = line.strip_prefix("FilePmdMapped:") {
            return Ok(kb.trim().trim_end_matches(" kB").parse()?);
        }
    }
    Ok(0)
}
