//! The cluster file (docs/protocol.md §4): the slaves in placement order and the number
//! of copies of every vector.
//!
//! ```toml
//! replicas = 2                 # copies of every vector; default 1
//! group = 16                   # consecutive vids placed together; default 1
//! [[slaves]]
//! name = "s0"
//! addr = "127.0.0.1:7101"
//! [[slaves]]
//! name = "s1"
//! addr = "127.0.0.1:7102"
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::placement::Placement;

/// The slaves of a cluster, in file order (the order placement uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Copies of every vector, on consecutive slaves (default 1).
    #[serde(default = "one")]
    pub replicas: usize,
    /// Consecutive vids that share their owners (a power of two; default
    /// [`DEFAULT_GROUP`]).
    #[serde(default = "default_group")]
    pub group: u64,
    /// The slaves; adding one at the end moves the fewest vectors.
    pub slaves: Vec<SlaveEntry>,
}

/// The default `group`: see `docs/protocol.md` §4 for how it was chosen.
pub const DEFAULT_GROUP: u64 = 64;

fn one() -> usize {
    1
}

fn default_group() -> u64 {
    DEFAULT_GROUP
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

impl ClusterConfig {
    /// Reads and validates a cluster file.
    pub fn load(path: &Path) -> Result<ClusterConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.to_owned(),
            cause,
        })?;
        let config: ClusterConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        config.validate().map_err(|message| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        Ok(config)
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
        if !self.group.is_power_of_two() {
            return Err(format!(
                "group = {}: it must be a power of two (1 places every vid on its own)",
                self.group
            ));
        }
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
        }
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
