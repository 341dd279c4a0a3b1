//! What one message between two threads costs this machine: a ping-pong
//! over loopback TCP, the floor under every hop of a query in a local
//! cluster. Measured with the two threads free to run on any CPU, where a
//! message may wake a thread on the other CPU, and with both held on one
//! CPU, where no wake-up crosses CPUs. The two kinds of run alternate; the
//! figures are medians over rounds.
//!
//! `cargo run --release -p bitfold-benches --example wakeup [round trips] [bytes]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use bitfold_workload::harness::process_cpu;

/// What a run of round trips cost, per message (half a round trip).
struct PerMessage {
    wall: Duration,
    cpu: Duration,
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let trips: u32 = args.next().map_or(Ok(20_000), |a| a.parse())?;
    let bytes: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    anyhow::ensure!(
        trips > 0 && bytes > 0,
        "round trips and bytes must be positive"
    );
    let cpu = first_allowed_cpu()?;
    let (mut free, mut pinned) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        free.push(ping_pong(trips, bytes, None)?);
        pinned.push(ping_pong(trips, bytes, Some(cpu))?);
    }
    println!("{trips} round trips of {bytes} bytes over loopback TCP, 5 rounds each, medians:");
    for (label, runs) in [("threads free", &free), ("both on one CPU", &pinned)] {
        let wall = median(runs.iter().map(|r| r.wall).collect());
        let cpu = median(runs.iter().map(|r| r.cpu).collect());
        println!(
            "  {label:>15}: {:6.1} us wall, {:6.1} us CPU per message",
            wall.as_secs_f64() * 1e6,
            cpu.as_secs_f64() * 1e6
        );
    }
    Ok(())
}

/// `trips` round trips of `bytes` between two new threads, both on `cpu`
/// if given.
fn ping_pong(trips: u32, bytes: usize, cpu: Option<usize>) -> anyhow::Result<PerMessage> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut near = TcpStream::connect(listener.local_addr()?)?;
    let (mut far, _) = listener.accept()?;
    near.set_nodelay(true)?;
    far.set_nodelay(true)?;
    let echo = thread::spawn(move || -> anyhow::Result<()> {
        if let Some(cpu) = cpu {
            pin_to(cpu)?;
        }
        let mut buf = vec![0u8; bytes];
        for _ in 0..trips {
            far.read_exact(&mut buf)?;
            far.write_all(&buf)?;
        }
        Ok(())
    });
    let asker = thread::spawn(move || -> anyhow::Result<PerMessage> {
        if let Some(cpu) = cpu {
            pin_to(cpu)?;
        }
        let mut buf = vec![1u8; bytes];
        let (started, cpu_before) = (Instant::now(), process_cpu());
        for _ in 0..trips {
            near.write_all(&buf)?;
            near.read_exact(&mut buf)?;
        }
        let messages = 2 * trips;
        Ok(PerMessage {
            wall: started.elapsed() / messages,
            cpu: process_cpu().saturating_sub(cpu_before) / messages,
        })
    });
    let measured = asker.join().expect("the asking thread does not panic")?;
    echo.join().expect("the echoing thread does not panic")?;
    Ok(measured)
}

/// The lowest-numbered CPU this process may run on.
fn first_allowed_cpu() -> anyhow::Result<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity writes
    // at most its size into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            anyhow::bail!(
                "cannot read this process's CPUs: {}",
                std::io::Error::last_os_error()
            );
        }
        set
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, inside the set.
        .find(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .ok_or_else(|| anyhow::anyhow!("this process may run on no CPU"))
}

/// Keeps the calling thread on `cpu` alone.
fn pin_to(cpu: usize) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set, `cpu` is below
    // CPU_SETSIZE, and sched_setaffinity reads the set's size from it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            anyhow::bail!(
                "cannot hold a thread on CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}
