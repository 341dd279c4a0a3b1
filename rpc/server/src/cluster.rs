//! The cluster file (docs/protocol.md §4): the slaves in placement order and the number
//! of copies of every vector, and optionally the master's address (which
//! slaves started with the file admit, docs/protocol.md §11) and its
//! certificate files (§11).
//!
//! ```toml
//! master = "127.0.0.1:7100"    # optional: where the master is
//! replicas = 2                 # copies of every vector; default 1
//! group = 16                   # consecutive vids placed together, or "all" (the default)
//! piece = 1048576              # bits per column piece; default 2^20
//! [[slaves]]
//! name = "s0"
//! addr = "127.0.0.1:7101"
//! [[slaves]]
//! name = "s1"
//! addr = "127.0.0.1:7102"
//! [tls]                        # optional: mutual TLS, paths relative to this file
//! ca = "tls/ca.pem"
//! cert = "tls/master/cert.pem"
//! key = "tls/master/key.pem"
//! ```

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::pieces::{DEFAULT_PIECE, Pieces};
use crate::placement::{GROUP_ALL, Placement};
use crate::tls::Files;

/// The slaves of a cluster, in file order (the order placement uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Copies of every vector, on consecutive slaves (default 1).
    #[serde(default = "one")]
    pub replicas: usize,
    /// Consecutive vids that share their owners (a power of two, or
    /// [`GROUP_ALL`], written `"all"`; default [`DEFAULT_GROUP`]).
    #[serde(default = "default_group", with = "group_field")]
    pub group: u64,
    /// Bits per column piece (a power of two from 2^16 to 2^32; default
    /// [`DEFAULT_PIECE`]): see [`crate::pieces`].
    #[serde(default = "default_piece")]
    pub piece: u64,
    /// The slaves; adding one at the end moves the fewest vectors.
    pub slaves: Vec<SlaveEntry>,
}

/// The default `group`, `"all"`: see `docs/protocol.md` §4 for how it was chosen.
pub const DEFAULT_GROUP: u64 = GROUP_ALL;

/// Reads a `group` as a command line writes it: a power of two, or `all`.
pub fn parse_group(text: &str) -> Result<u64, String> {
    if text == "all" {
        return Ok(GROUP_ALL);
    }
    match text.parse::<u64>() {
        Ok(group) if group.is_power_of_two() => Ok(group),
        _ => Err(format!("{text:?} is neither a power of two nor all")),
    }
}

/// A `group` as a person writes it: the number, or `all`.
pub fn group_name(group: u64) -> String {
    if group == GROUP_ALL {
        "all".to_owned()
    } else {
        group.to_string()
    }
}

fn one() -> usize {
    1
}

fn default_group() -> u64 {
    DEFAULT_GROUP
}

fn default_piece() -> u64 {
    DEFAULT_PIECE
}

/// `group` as the file writes it: a number, or `"all"` for [`GROUP_ALL`].
mod group_field {
    use serde::{Deserialize, Deserializer, Serializer, de};

    use crate::placement::GROUP_ALL;

    pub(super) fn serialize<S: Serializer>(group: &u64, out: S) -> Result<S::Ok, S::Error> {
        if *group == GROUP_ALL {
            out.serialize_str("all")
        } else {
            out.serialize_u64(*group)
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Number(u64),
        Name(String),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<u64, D::Error> {
        match Written::deserialize(input)? {
            Written::Number(group) => Ok(group),
            Written::Name(name) if name == "all" => Ok(GROUP_ALL),
            Written::Name(name) => Err(de::Error::custom(format!(
                "group = {name:?}: write a power of two or \"all\""
            ))),
        }
    }
}

/// One slave of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlaveEntry {
    /// A unique name, used in messages and status (`s0`).
    pub name: String,
    /// Where the slave listens, `HOST:PORT`.
    pub addr: String,
}

/// Why a cluster file cannot be used; every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the cluster file {}: {cause}", path.display())]
    Read {
        /// The cluster file.
        path: PathBuf,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("cluster file {}: {message}", path.display())]
    Parse {
        /// The cluster file.
        path: PathBuf,
        /// What is wrong, with its line and column.
        message: String,
    },
    /// The file parses but describes an impossible cluster.
    #[error("cluster file {}: {message}", path.display())]
    Invalid {
        /// The cluster file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// A whole cluster file: the cluster, and the `master` key and `[tls]`
/// table if it has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFile {
    /// The slaves and how vectors are placed on them.
    pub cluster: ClusterConfig,
    /// The `master` key: the master's address, `HOST:PORT`. A slave started
    /// with the file admits connections from the addresses its host, the
    /// `[[masters]]`' hosts and the slaves' hosts resolve to
    /// (docs/protocol.md §11); the master does not read it.
    pub master: Option<String>,
    /// The `[tls]` table: the master's certificate files, as the file
    /// writes them (relative to its folder unless absolute; see
    /// [`Files::relative_to`]). The master uses them when given no `--tls DIR`.
    pub tls: Option<Files>,
    /// The `[[masters]]` entries: several masters whose records Raft
    /// replicates (docs/protocol.md §12). Empty: one master, as `master`
    /// or `--listen` says.
    pub masters: Vec<MasterEntry>,
}

/// One master of a replicated cluster (a `[[masters]]` entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MasterEntry {
    /// A unique name, used in messages and status (`m0`); it also numbers
    /// the master in Raft, so a master replaced keeps no old name.
    pub name: String,
    /// Where the master listens, `HOST:PORT`, as the other masters, the
    /// slaves and clients reach it.
    pub addr: String,
}

/// Checks the `[[masters]]` entries: 1, 3 or 5 (a majority survives the
/// loss of any one, or two), names and addresses unique.
fn check_masters(masters: &[MasterEntry]) -> Result<(), String> {
    if !masters.is_empty() && ![1, 3, 5].contains(&masters.len()) {
        return Err(format!(
            "{} [[masters]] entries: list 1, 3 or 5 masters (a majority of them must be up \
             to write, so an even count only adds a machine that can fail)",
            masters.len()
        ));
    }
    let mut names = BTreeSet::new();
    let mut addrs = BTreeSet::new();
    for entry in masters {
        check_master(&entry.addr)?;
        if !names.insert(entry.name.as_str()) {
            return Err(format!(
                "two [[masters]] are named {:?}: give each its own name",
                entry.name
            ));
        }
        if !addrs.insert(entry.addr.as_str()) {
            return Err(format!(
                "two [[masters]] listen on {}: give each its own address",
                entry.addr
            ));
        }
    }
    Ok(())
}

impl ClusterFile {
    /// Reads and validates a cluster file, `master` key and `[tls]` table included.
    pub fn load(path: &Path) -> Result<ClusterFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.to_owned(),
            cause,
        })?;
        ClusterFile::parse(&text, path)
    }

    /// Parses and validates the text of a cluster file, `master` key and
    /// `[tls]` table included; errors name `path`.
    pub fn parse(text: &str, path: &Path) -> Result<ClusterFile, ConfigError> {
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().replace('\n', " "),
        };
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let mut table: toml::Table = toml::from_str(text).map_err(parse_error)?;
        let master = table.remove("master");
        let tls = table.remove("tls");
        let masters = table.remove("masters");
        // Without a `master` key, `[tls]` table or `[[masters]]` the text is
        // read as the cluster directly, so that an error in it gives its line
        // and column.
        let cluster: ClusterConfig = match (&master, &tls, &masters) {
            (None, None, None) => toml::from_str(text),
            _ => table.try_into(),
        }
        .map_err(parse_error)?;
        let masters: Vec<MasterEntry> = masters
            .map(|masters| {
                masters.try_into().map_err(|e: toml::de::Error| {
                    invalid(format!(
                        "[[masters]]: {} (each names a master's `name` and `addr`)",
                        e.to_string().trim_end().replace('\n', " ")
                    ))
                })
            })
            .transpose()?
            .unwrap_or_default();
        check_masters(&masters).map_err(invalid)?;
        let master = master
            .map(|master| match master {
                toml::Value::String(addr) => check_master(&addr).map(|()| addr),
                other => Err(format!(
                    "master = {other}: write the master's address as a string, \
                     master = \"HOST:PORT\""
                )),
            })
            .transpose()
            .map_err(invalid)?;
        let tls = tls
            .map(|tls| {
                tls.try_into::<Files>().map_err(|e| {
                    invalid(format!(
                        "[tls]: {} (it names `ca`, `cert` and `key`, paths of PEM files)",
                        e.to_string().trim_end().replace('\n', " ")
                    ))
                })
            })
            .transpose()?;
        cluster.validate().map_err(invalid)?;
        Ok(ClusterFile {
            cluster,
            master,
            tls,
            masters,
        })
    }

    /// The cluster file text: the `master` key, the cluster, the
    /// `[[masters]]`, then the `[tls]` table.
    pub fn to_toml(&self) -> String {
        let mut text = match &self.master {
            Some(master) => format!("master = {}\n", toml::Value::from(master.as_str())),
            None => String::new(),
        };
        text.push_str(&self.cluster.to_toml());
        for entry in &self.masters {
            let table =
                toml::to_string(entry).expect("a master's name and address always serialise");
            text.push_str("\n[[masters]]\n");
            text.push_str(&table);
        }
        if let Some(tls) = &self.tls {
            let table = toml::to_string(tls).expect("paths of TLS files always serialise");
            text.push_str("\n[tls]\n");
            text.push_str(&table);
        }
        text
    }
}

impl ClusterConfig {
    /// Reads and validates a cluster file (its `[tls]` table is checked and
    /// left to [`ClusterFile::load`]).
    pub fn load(path: &Path) -> Result<ClusterConfig, ConfigError> {
        ClusterFile::load(path).map(|file| file.cluster)
    }

    /// Checks what a cluster needs: at least one slave, names and addresses
    /// unique, addresses `HOST:PORT`, `1 <= replicas <= slaves`.
    pub fn validate(&self) -> Result<(), String> {
        if self.slaves.is_empty() {
            return Err("no slaves: add at least one [[slaves]] entry".into());
        }
        let mut names = HashSet::new();
        let mut addrs = HashSet::new();
        for slave in &self.slaves {
            if slave.name.is_empty() {
                return Err(format!("the slave at {} has an empty name", slave.addr));
            }
            if !names.insert(slave.name.as_str()) {
                return Err(format!(
                    "two slaves are named {:?}: names must be unique",
                    slave.name
                ));
            }
            check_addr(&slave.addr).map_err(|why| format!("slave {}: {why}", slave.name))?;
            if !addrs.insert(slave.addr.as_str()) {
                return Err(format!(
                    "two slaves have the address {}: addresses must be unique",
                    slave.addr
                ));
            }
        }
        if !self.group.is_power_of_two() && self.group != GROUP_ALL {
            return Err(format!(
                "group = {}: it must be a power of two (1 places every vid on its own) or \"all\"",
                self.group
            ));
        }
        Pieces::new(self.piece)?;
        if self.replicas == 0 || self.replicas > self.slaves.len() {
            return Err(format!(
                "replicas = {} but there are {} slaves: replicas must be between 1 and the number of slaves",
                self.replicas,
                self.slaves.len()
            ));
        }
        Ok(())
    }

    /// How this cluster places vids.
    pub fn placement(&self) -> Placement {
        Placement {
            slaves: self.slaves.len(),
            replicas: self.replicas,
            group: self.group,
            pieces: self.pieces(),
        }
    }

    /// How this cluster cuts vectors.
    pub fn pieces(&self) -> Pieces {
        Pieces::new(self.piece).expect("a validated cluster's piece is valid")
    }

    /// The cluster file text for this configuration.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a cluster configuration always serialises")
    }
}

fn check_addr(addr: &str) -> Result<(), String> {
    let bad = || format!("address {addr:?} is not HOST:PORT (for example 127.0.0.1:7101)");
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains(char::is_whitespace) || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(())
}

/// The host of a `HOST:PORT` address (an IPv6 address without its brackets).
pub(crate) fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Checks a `master` key: `HOST:PORT`, and a host the master's connections
/// can come from (not a wildcard such as 0.0.0.0).
fn check_master(addr: &str) -> Result<(), String> {
    check_addr(addr).map_err(|why| format!("master: {why}"))?;
    if host_of(addr)
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
    {
        return Err(format!(
            "master = {addr:?}: no connection comes from {}; write the address of the \
             master's machine as its slaves see it (for example 10.0.0.5:7100)",
            host_of(addr)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<ClusterConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, text).unwrap();
        ClusterConfig::load(&path)
    }

    #[track_caller]
    fn invalid(text: &str, wanted: &str) {
        let message = load_text(text).unwrap_err().to_string();
        assert!(message.contains("cluster.toml"), "{message}");
        assert!(message.contains(wanted), "{message}");
    }

    const TWO: &str = "[[slaves]]\nname = \"s0\"\naddr = \"127.0.0.1:7101\"\n\
                       [[slaves]]\nname = \"s1\"\naddr = \"localhost:7102\"\n";

    #[test]
    fn loads_and_round_trips() {
        let config = load_text(&format!("replicas = 2\n{TWO}")).unwrap();
        assert_eq!(config.replicas, 2);
        assert_eq!(config.slaves[1].name, "s1");
        assert_eq!(config.slaves[1].addr, "localhost:7102");
        assert_eq!(load_text(&config.to_toml()).unwrap(), config);
        assert_eq!(load_text(TWO).unwrap().replicas, 1);
    }

    #[test]
    fn a_tls_table_names_files_relative_to_the_cluster_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        let text = format!(
            "{TWO}[tls]\nca = \"tls/ca.pem\"\ncert = \"tls/m/cert.pem\"\nkey = \"/etc/k.pem\"\n"
        );
        std::fs::write(&path, text).unwrap();
        let file = ClusterFile::load(&path).unwrap();
        let tls = file.tls.clone().expect("a [tls] table");
        let found = tls.relative_to(dir.path());
        assert_eq!(found.ca, dir.path().join("tls/ca.pem"));
        assert_eq!(found.cert, dir.path().join("tls/m/cert.pem"));
        assert_eq!(found.key, Path::new("/etc/k.pem"));
        // The cluster is read as without the table, and written back whole.
        assert_eq!(file.cluster, load_text(TWO).unwrap());
        assert_eq!(ClusterConfig::load(&path).unwrap(), file.cluster);
        std::fs::write(&path, file.to_toml()).unwrap();
        assert_eq!(ClusterFile::load(&path).unwrap(), file);
    }

    #[test]
    fn a_master_key_is_read_and_written_back_before_the_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, format!("master = \"[::1]:7100\"\n{TWO}")).unwrap();
        let file = ClusterFile::load(&path).unwrap();
        assert_eq!(file.master.as_deref(), Some("[::1]:7100"));
        assert_eq!(file.cluster, load_text(TWO).unwrap());
        let text = file.to_toml();
        assert!(text.starts_with("master = \"[::1]:7100\"\n"), "{text}");
        std::fs::write(&path, text).unwrap();
        assert_eq!(ClusterFile::load(&path).unwrap(), file);
        assert_eq!(host_of("[::1]:7100"), "::1");
        assert_eq!(host_of("db1.example:7100"), "db1.example");
    }

    #[test]
    fn a_master_key_that_is_no_address_to_admit_is_refused() {
        invalid(&format!("master = 7100\n{TWO}"), "master = \"HOST:PORT\"");
        invalid(
            &format!("master = \"db1\"\n{TWO}"),
            "master: address \"db1\"",
        );
        invalid(
            &format!("master = \"0.0.0.0:7100\"\n{TWO}"),
            "no connection comes from 0.0.0.0",
        );
        invalid(
            &format!("master = \"[::]:7100\"\n{TWO}"),
            "no connection comes from ::",
        );
        // An unknown key beside a `master` key is still named.
        invalid(&format!("master = \"h:1\"\n{TWO}replica = 1\n"), "replica");
    }

    #[test]
    fn a_tls_table_without_its_files_is_refused() {
        invalid(
            &format!("{TWO}[tls]\nca = \"ca.pem\"\n"),
            "[tls]: missing field `cert`",
        );
        invalid(
            &format!("{TWO}[tls]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\nkye = \"d\"\n"),
            "unknown field `kye`",
        );
        invalid(&format!("tls = 3\n{TWO}"), "[tls]: ");
    }

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let missing = ClusterConfig::load(Path::new("/nonexistent/cluster.toml")).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/cluster.toml"));
        invalid("replicas = \n", "cluster.toml");
        invalid("replicas = 1\n", "slaves");
        invalid("slaves = []\n", "no slaves");
        invalid(
            &format!("replicas = 3\n{TWO}"),
            "replicas = 3 but there are 2 slaves",
        );
        invalid(&format!("replicas = 0\n{TWO}"), "replicas = 0");
        invalid(
            &format!("{TWO}[[slaves]]\nname = \"s0\"\naddr = \"h:1\"\n"),
            "named \"s0\"",
        );
        invalid(
            &format!("{TWO}[[slaves]]\nname = \"s2\"\naddr = \"localhost:7102\"\n"),
            "two slaves have the address localhost:7102",
        );
        invalid(
            "[[slaves]]\nname = \"a\"\naddr = \"nowhere\"\n",
            "not HOST:PORT",
        );
        invalid(
            "[[slaves]]\nname = \"a\"\naddr = \"h:70000\"\n",
            "not HOST:PORT",
        );
        invalid("[[slaves]]\nname = \"\"\naddr = \"h:1\"\n", "empty name");
        invalid(&format!("colour = 1\n{TWO}"), "colour");
    }
}
