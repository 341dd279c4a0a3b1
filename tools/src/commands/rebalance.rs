//! `bitfold rebalance`: move every vector onto its owners under the
//! master's cluster file, step by step, with a progress bar.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::RebalanceArgs;

/// Vectors moved per call to the master: small enough that imports,
/// updates and the progress bar move between calls (a call holds the
/// master's write lock), large enough that a new owner receives a few large
/// segments rather than many small ones it would merge during the move
/// (512 gave 8 to 9 segments and a merge of them all: 85 MB/s instead of
/// 140 on loopback, benches/runs/2026-12-02-slave-to-slave-copies.md).
const STEP: u32 = 2048;

/// Runs `bitfold rebalance`.
pub fn run(args: RebalanceArgs) -> anyhow::Result<()> {
    let client = super::connect(&args.master, args.tls.as_deref())?;
    let started = Instant::now();
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("moving [{bar:40}] {pos}/{len} vectors ({eta}) {msg}")
            .expect("the progress template is valid")
            .progress_chars("=> "),
    );
    let (mut copied, mut bytes, mut removed) = (0, 0, 0);
    loop {
        let step = client.rebalance(STEP)?;
        copied += step.copied;
        bytes += step.copied_bytes;
        removed += step.removed;
        bar.set_length(step.total);
        bar.set_position(step.done);
        bar.set_message(format!("{} MB copied", bytes >> 20));
        if step.finished {
            break;
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "every vector is on its owners: copied {copied} vectors ({:.1} MB, {:.0} MB/s), \
         removed {removed} surplus copies, in {seconds:.1}s",
        bytes as f64 / 1e6,
        bytes as f64 / 1e6 / seconds.max(1e-9)
    );
    Ok(())
}
