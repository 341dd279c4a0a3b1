//! `bitfold status`: each slave, up or down and since when, vectors, bytes
//! stored, and the bytes its folds read and it sent since it started.

use std::time::SystemTime;

use crate::cli::StatusArgs;

/// Runs `bitfold status`; succeeds whenever the master answers, whatever the slaves' state.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = super::connect(&args.master, args.tls.as_deref())?;
    let slaves = client.status()?;
    let now = SystemTime::now();
    println!(
        "{:<8} {:<22} {:<26} {:>10} {:>12} {:>14} {:>14}",
        "SLAVE", "ADDRESS", "STATE", "VECTORS", "BYTES", "READ", "SENT"
    );
    for slave in &slaves {
        let age = now.duration_since(slave.since).unwrap_or_default();
        let state = format!(
            "{} for {}",
            if slave.up { "up" } else { "down" },
            human_duration(age)
        );
        println!(
            "{:<8} {:<22} {:<26} {:>10} {:>12} {:>14} {:>14}",
            slave.name,
            slave.addr,
            state,
            slave.vectors,
            slave.bytes,
            slave.read_bytes,
            slave.sent_bytes
        );
        if let Some(reason) = &slave.reason {
            println!("         {reason}");
        }
    }
    let up = slaves.iter().filter(|s| s.up).count();
    println!("{up} of {} slaves up", slaves.len());
    let placed = client.placement()?;
    println!(
        "{} vectors: {} under-replicated, {} with no copy up, {} misplaced{}",
        placed.vectors,
        placed.under_replicated,
        placed.lost,
        placed.misplaced,
        if placed.moving {
            " (a move is in progress: run `bitfold rebalance`)"
        } else {
            ""
        }
    );
    Ok(())
}

/// `4s`, `3m12s`, `2h05m`, `3d04h`.
fn human_duration(age: std::time::Duration) -> String {
    let s = age.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::human_duration;
    use std::time::Duration;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(Duration::from_secs(4)), "4s");
        assert_eq!(human_duration(Duration::from_secs(192)), "3m12s");
        assert_eq!(human_duration(Duration::from_secs(7500)), "2h05m");
        assert_eq!(human_duration(Duration::from_secs(273_600)), "3d04h");
    }
}
