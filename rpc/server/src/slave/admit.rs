//! Whose connections a slave without TLS accepts (docs/protocol.md §11):
//! given its cluster, only those from the IP addresses the hosts of the
//! cluster's master and slaves resolve to, exactly. An address can be
//! borrowed (any process on an admitted machine, a spoofed or reassigned
//! address), so this keeps out mistakes and strangers, not an attacker:
//! that is what TLS is for, and with TLS the certificates' roles decide
//! instead.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crate::cluster::{ClusterFile, ConfigError, host_of};

/// How often a slave re-reads its cluster file ([`Admit::File`]).
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// Whose connections a slave without TLS accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Admit {
    /// Every address's (the slave warns at start that it does).
    #[default]
    Everyone,
    /// Those of the master (its `master` key) and slaves of this cluster
    /// file, re-read every [`RELOAD_INTERVAL`]; a file that no longer
    /// loads leaves the addresses as they were.
    File(PathBuf),
    /// Those of these `HOST:PORT` addresses' hosts (a local cluster's),
    /// resolved once.
    Hosts(Vec<String>),
}

/// The IP addresses a slave admits now.
pub(crate) struct Admitted {
    /// Where they come from, for messages: `the cluster file FILE`.
    from: String,
    ips: RefCell<BTreeSet<IpAddr>>,
}

/// The addresses each host resolved to when it last did.
type Resolved = BTreeMap<String, Vec<IpAddr>>;

impl Admitted {
    /// Who `admit` lets in (None for everyone, warned about), and for a
    /// cluster file the task that re-reads it; a file that does not load,
    /// or names no master, is an error.
    pub(crate) async fn start(admit: &Admit) -> Result<Option<Rc<Admitted>>, crate::Error> {
        let (hosts, from) = match admit {
            Admit::Everyone => {
                tracing::warn!(
                    "this slave admits connections from any address: start it with its \
                     cluster file (`bitfold slave --cluster FILE`) to admit only its \
                     master's and slaves', or run the cluster with --tls"
                );
                return Ok(None);
            }
            Admit::File(path) => (
                hosts_in(path).map_err(|e| crate::Error::Config(e.to_string()))?,
                format!("the cluster file {}", path.display()),
            ),
            Admit::Hosts(addrs) => (
                hosts_of(addrs.iter().map(String::as_str)),
                "this local cluster".to_owned(),
            ),
        };
        let (resolved, trouble) = resolve(&hosts, &Resolved::new()).await;
        if let Some(trouble) = &trouble {
            tracing::warn!("{trouble}");
        }
        let admitted = Rc::new(Admitted {
            ips: RefCell::new(ips(&resolved)),
            from,
        });
        tracing::info!("{}", admitted.describe());
        if let Admit::File(path) = admit {
            let watch = admitted.clone().watch(path.clone(), resolved, trouble);
            tokio::task::spawn_local(watch);
        }
        Ok(Some(admitted))
    }

    /// Whether a connection from `peer` is admitted: if not, why, naming
    /// the fix.
    pub(crate) fn check(&self, peer: SocketAddr) -> Result<(), String> {
        let ip = peer.ip().to_canonical();
        if self.ips.borrow().contains(&ip) {
            return Ok(());
        }
        Err(format!(
            "{ip} is none of the addresses of the master and slaves of {} (a slave admits \
             only those without --tls; list the machine there, or run the cluster with --tls)",
            self.from
        ))
    }

    /// `admits connections only from 127.0.0.1, ::1 (the master and slaves of ...)`.
    fn describe(&self) -> String {
        let ips: Vec<String> = self.ips.borrow().iter().map(IpAddr::to_string).collect();
        format!(
            "admits connections only from {} (the master and slaves of {})",
            if ips.is_empty() {
                "nowhere".to_owned()
            } else {
                ips.join(", ")
            },
            self.from
        )
    }

    /// Re-reads the cluster file `path` every [`RELOAD_INTERVAL`], forever,
    /// logging each change of the addresses and each new trouble once.
    async fn watch(
        self: Rc<Self>,
        path: PathBuf,
        mut resolved: Resolved,
        mut trouble: Option<String>,
    ) {
        loop {
            tokio::time::sleep(RELOAD_INTERVAL).await;
            let now = match hosts_in(&path) {
                Ok(hosts) => {
                    let (now, why) = resolve(&hosts, &resolved).await;
                    resolved = now;
                    let ips = ips(&resolved);
                    if ips != *self.ips.borrow() {
                        *self.ips.borrow_mut() = ips;
                        tracing::info!("{}", self.describe());
                    }
                    why
                }
                Err(err) => Some(format!("kept the addresses admitted before: {err}")),
            };
            if now.is_some() && now != trouble {
                tracing::warn!("{}", now.as_deref().unwrap_or_default());
            }
            trouble = now;
        }
    }
}

/// The hosts of the master and slaves in the cluster file `path`.
fn hosts_in(path: &Path) -> Result<Vec<String>, ConfigError> {
    let file = ClusterFile::load(path)?;
    if file.master.is_none() && file.masters.is_empty() {
        return Err(ConfigError::Invalid {
            path: path.to_owned(),
            message: "no `master = \"HOST:PORT\"` nor [[masters]]: a slave started with the file \
                      admits only the addresses of the masters and slaves it names; add the \
                      master's"
                .to_owned(),
        });
    }
    let masters = file.master.iter().map(String::as_str);
    let replicated = file.masters.iter().map(|m| m.addr.as_str());
    let slaves = file.cluster.slaves.iter().map(|slave| slave.addr.as_str());
    Ok(hosts_of(masters.chain(replicated).chain(slaves)))
}

/// The distinct hosts of `HOST:PORT` addresses.
fn hosts_of<'a>(addrs: impl Iterator<Item = &'a str>) -> Vec<String> {
    let hosts: BTreeSet<&str> = addrs.map(host_of).collect();
    hosts.into_iter().map(str::to_owned).collect()
}

/// The addresses each of `hosts` resolves to: `localhost` to both
/// loopback addresses, a host that does not resolve to those it had
/// `before`. The second value says which did not, if any.
async fn resolve(hosts: &[String], before: &Resolved) -> (Resolved, Option<String>) {
    let mut resolved = Resolved::new();
    let mut failed = Vec::new();
    for host in hosts {
        let ips = if host.eq_ignore_ascii_case("localhost") {
            Ok(vec![
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            ])
        } else {
            tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map(|found| found.map(|addr| addr.ip().to_canonical()).collect())
        };
        match ips {
            Ok(ips) => {
                resolved.insert(host.clone(), ips);
            }
            Err(err) => {
                failed.push(format!("{host} ({})", crate::net::describe_io(&err)));
                if let Some(ips) = before.get(host) {
                    resolved.insert(host.clone(), ips.clone());
                }
            }
        }
    }
    let trouble = (!failed.is_empty()).then(|| {
        format!(
            "cannot resolve {}: connections from there are refused until it resolves (those \
             it resolved to before, if it did, are still admitted)",
            failed.join(", ")
        )
    });
    (resolved, trouble)
}

/// Every address of every host.
fn ips(resolved: &Resolved) -> BTreeSet<IpAddr> {
    resolved.values().flatten().copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a slave admitting `admit` answers a connection from each of
    /// `peers`, or why it did not start.
    fn checks(admit: &Admit, peers: &[&str]) -> Result<Vec<Result<(), String>>, String> {
        crate::net::block_on_local(async {
            let admitted = Admitted::start(admit).await.map_err(|e| e.to_string())?;
            let admitted = admitted.expect("an allow-list");
            Ok(peers
                .iter()
                .map(|peer| admitted.check(peer.parse().unwrap()))
                .collect())
        })
        .unwrap()
    }

    /// Which of `peers` a slave admitting `admit` admits.
    fn admitted(admit: &Admit, peers: &[&str]) -> Vec<bool> {
        let checks = checks(admit, peers).unwrap();
        checks.iter().map(Result::is_ok).collect()
    }

    /// A cluster file holding `text`, in a folder that lives as long as
    /// the first value.
    fn cluster_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    const S0: &str = "[[slaves]]\nname = \"s0\"\naddr = \"10.0.0.2:7101\"\n";

    #[test]
    fn exactly_the_addresses_of_the_hosts_are_admitted() {
        let hosts = Admit::Hosts(vec!["127.0.0.1:0".into(), "10.1.2.3:7101".into()]);
        assert_eq!(
            admitted(
                &hosts,
                &[
                    "127.0.0.1:50000",
                    "10.1.2.3:1",
                    "[::ffff:10.1.2.3]:1",
                    "127.0.0.2:50000",
                    "10.1.2.4:1",
                    "[::1]:50000",
                ]
            ),
            [true, true, true, false, false, false],
            "any port of an exact address (also as IPv4-mapped IPv6), nothing else"
        );
    }

    #[test]
    fn localhost_is_both_loopback_addresses() {
        let hosts = Admit::Hosts(vec!["localhost:7101".into(), "[::1]:7102".into()]);
        assert_eq!(
            admitted(&hosts, &["127.0.0.1:1", "[::1]:1", "127.0.0.2:1"]),
            [true, true, false]
        );
    }

    #[test]
    fn a_cluster_file_admits_its_master_and_slaves_and_a_refusal_names_the_fix() {
        let (_dir, path) = cluster_file(&format!("master = \"10.0.0.1:7100\"\n{S0}"));
        let checks = checks(
            &Admit::File(path.clone()),
            &["10.0.0.1:9", "10.0.0.2:9", "10.0.0.3:9"],
        );
        let [master, slave, stranger] = <[_; 3]>::try_from(checks.unwrap()).unwrap();
        assert_eq!((master, slave), (Ok(()), Ok(())));
        let refusal = stranger.unwrap_err();
        assert!(
            refusal.contains("10.0.0.3 is none of the addresses")
                && refusal.contains(&path.display().to_string())
                && refusal.contains("--tls"),
            "{refusal}"
        );
    }

    #[test]
    fn a_cluster_file_without_a_master_is_refused_at_start() {
        let (_dir, path) = cluster_file(S0);
        let err = checks(&Admit::File(path), &[]).unwrap_err();
        assert!(err.contains("no `master = \"HOST:PORT\"`"), "{err}");
    }
}
