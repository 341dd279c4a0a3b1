//! `bitfold status`: in a replicated cluster, each master's state and log
//! position; each slave, up or down and since when, vectors, bytes stored,
//! and the bytes its folds read and it sent since it started; and, over
//! TLS, a warning for each certificate in use that expires soon.

use std::io::Write;
use std::time::{Duration, SystemTime};

use bitfold_client::MasterState;

use crate::cli::StatusArgs;

/// How long before a certificate in use expires `status` warns of it.
const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// Runs `bitfold status`; succeeds whenever the master answers, whatever the slaves' state.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let tls = super::load_tls(args.tls.as_deref())?;
    let client = super::connect_with(&args.master, tls.as_ref())?;
    let status = client.full_status()?;
    let slaves = &status.slaves;
    let now = SystemTime::now();
    // Written, not printed: a reader that stops reading (`| head`) ends it quietly.
    let mut out = std::io::stdout().lock();
    for master in &status.masters {
        writeln!(out, "{}", master_line(master))?;
    }
    writeln!(
        out,
        "{:<8} {:<22} {:<26} {:>10} {:>12} {:>14} {:>14}",
        "SLAVE", "ADDRESS", "STATE", "VECTORS", "BYTES", "READ", "SENT"
    )?;
    for slave in slaves {
        let age = now.duration_since(slave.since).unwrap_or_default();
        let state = format!(
            "{} for {}",
            if slave.up { "up" } else { "down" },
            human_duration(age)
        );
        writeln!(
            out,
            "{:<8} {:<22} {:<26} {:>10} {:>12} {:>14} {:>14}",
            slave.name,
            slave.addr,
            state,
            slave.vectors,
            slave.bytes,
            slave.read_bytes,
            slave.sent_bytes
        )?;
        if let Some(reason) = &slave.reason {
            writeln!(out, "         {reason}")?;
        }
    }
    let up = slaves.iter().filter(|s| s.up).count();
    writeln!(out, "{up} of {} slaves up", slaves.len())?;
    let placed = client.placement()?;
    writeln!(
        out,
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
    )?;
    let own = tls.map(|tls| {
        let holder = format!("this client ({})", tls.cert().display());
        (holder, tls.identity().not_after)
    });
    for (holder, expires) in status.certificates().into_iter().chain(own) {
        if let Some(warning) = expiry_warning(&holder, expires, now) {
            writeln!(out, "{warning}")?;
        }
    }
    Ok(())
}

/// `master NAME ADDR STATE log N [applied N] term N`, and why it is down;
/// only the leader, which answered, says what it applied.
fn master_line(m: &MasterState) -> String {
    let applied = if m.state == "leader" {
        format!(" applied {}", m.applied)
    } else {
        String::new()
    };
    let line = format!(
        "master {} {} {} log {}{applied} term {}",
        m.name, m.addr, m.state, m.log_index, m.term
    );
    match &m.reason {
        Some(reason) => format!("{line}: {reason}"),
        None => line,
    }
}

/// A warning if the certificate of `holder` expires within
/// [`EXPIRY_WARNING`] of `now` (or has expired).
fn expiry_warning(holder: &str, expires: SystemTime, now: SystemTime) -> Option<String> {
    let fix = "issue a new one with `bitfold certs issue` and put it in place: servers \
               reload it within seconds";
    match expires.duration_since(now) {
        Ok(left) if left <= EXPIRY_WARNING => Some(format!(
            "warning: the certificate of {holder} expires in {}: {fix}",
            human_duration(left),
        )),
        Ok(_) => None,
        Err(ago) => Some(format!(
            "warning: the certificate of {holder} expired {} ago: {fix}",
            human_duration(ago.duration())
        )),
    }
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
    use super::{MasterState, expiry_warning, human_duration, master_line};
    use std::time::Duration;

    #[test]
    fn a_master_line_names_the_master_its_state_and_why_it_is_down() {
        let mut m = MasterState {
            name: "m1".into(),
            addr: "127.0.0.1:7101".into(),
            state: "follower".into(),
            log_index: 41,
            applied: 40,
            term: 3,
            reason: None,
        };
        assert_eq!(
            master_line(&m),
            "master m1 127.0.0.1:7101 follower log 41 term 3"
        );
        m.state = "leader".into();
        assert_eq!(
            master_line(&m),
            "master m1 127.0.0.1:7101 leader log 41 applied 40 term 3"
        );
        m.state = "down".into();
        m.reason = Some("connection refused".into());
        assert_eq!(
            master_line(&m),
            "master m1 127.0.0.1:7101 down log 41 term 3: connection refused"
        );
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(Duration::from_secs(4)), "4s");
        assert_eq!(human_duration(Duration::from_secs(192)), "3m12s");
        assert_eq!(human_duration(Duration::from_secs(7500)), "2h05m");
        assert_eq!(human_duration(Duration::from_secs(273_600)), "3d04h");
    }

    #[test]
    fn a_certificate_is_warned_of_from_14_days_before_it_expires() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(expiry_warning("s0", now + 15 * day, now), None);
        let soon = expiry_warning("s0", now + 14 * day, now).unwrap();
        assert!(soon.contains("s0 expires in 14d00h"), "{soon}");
        assert!(soon.contains("bitfold certs issue"), "{soon}");
        let past = expiry_warning("master", now - day, now).unwrap();
        assert!(past.contains("master expired 1d00h ago"), "{past}");
    }
}
