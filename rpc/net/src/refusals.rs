//! The log of the connections a server's `serve` refused: at most one line
//! per peer address a minute, so that a peer that dials again and again (a
//! misconfigured machine, a scanner) does not flood the log. The next line
//! for an address says how many refusals went unlogged since the last.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// How often one peer address's refusals are logged at most.
const EVERY: Duration = Duration::from_secs(60);

/// Addresses remembered at most; past it, the oldest minute's are
/// forgotten first, and refusals from new addresses go unlogged until then.
const MOST: usize = 4096;

/// When each peer address was last logged, and its refusals since.
#[derive(Default)]
pub(crate) struct Refusals {
    logged: HashMap<IpAddr, Logged>,
}

struct Logged {
    at: Instant,
    unlogged: u64,
}

impl Refusals {
    /// Logs (at warn) that the connection from `peer` was refused because
    /// `why`, unless its address was logged less than a minute ago.
    pub(crate) fn log(&mut self, peer: SocketAddr, why: &str) {
        match self.note(peer.ip(), Instant::now()) {
            Some(0) => tracing::warn!("refused a connection from {peer}: {why}"),
            Some(unlogged) => tracing::warn!(
                "refused a connection from {peer}: {why} (and {unlogged} more from {} since \
                 the last line)",
                peer.ip()
            ),
            None => {}
        }
    }

    /// Counts a refusal of `ip` at `now`: the refusals not logged since its
    /// last line if this one is to be logged, else None.
    fn note(&mut self, ip: IpAddr, now: Instant) -> Option<u64> {
        if let Some(logged) = self.logged.get_mut(&ip) {
            if now.duration_since(logged.at) < EVERY {
                logged.unlogged += 1;
                return None;
            }
            let unlogged = logged.unlogged;
            *logged = Logged {
                at: now,
                unlogged: 0,
            };
            return Some(unlogged);
        }
        if self.logged.len() >= MOST {
            self.logged
                .retain(|_, logged| now.duration_since(logged.at) < EVERY);
            if self.logged.len() >= MOST {
                return None;
            }
        }
        self.logged.insert(
            ip,
            Logged {
                at: now,
                unlogged: 0,
            },
        );
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_is_logged_once_a_minute_with_what_went_unlogged() {
        let mut refusals = Refusals::default();
        let start = Instant::now();
        let a = IpAddr::from([127, 0, 0, 2]);
        let b = IpAddr::from([127, 0, 0, 3]);
        assert_eq!(refusals.note(a, start), Some(0));
        assert_eq!(
            refusals.note(b, start),
            Some(0),
            "another address has its own minute"
        );
        for second in 1..60 {
            assert_eq!(refusals.note(a, start + Duration::from_secs(second)), None);
        }
        assert_eq!(refusals.note(a, start + EVERY), Some(59));
        assert_eq!(refusals.note(a, start + EVERY), None);
        assert_eq!(refusals.note(b, start + EVERY), Some(0));
    }

    #[test]
    fn many_addresses_are_remembered_up_to_a_bound() {
        let mut refusals = Refusals::default();
        let start = Instant::now();
        let ip = |i: usize| IpAddr::from(u32::try_from(i).unwrap().to_be_bytes());
        for i in 0..MOST {
            assert_eq!(refusals.note(ip(i), start), Some(0));
        }
        assert_eq!(refusals.note(ip(MOST), start), None, "full: not logged");
        assert_eq!(refusals.logged.len(), MOST);
        let later = start + EVERY;
        assert_eq!(
            refusals.note(ip(MOST), later),
            Some(0),
            "the old minute forgotten"
        );
        assert_eq!(refusals.logged.len(), 1);
    }
}
