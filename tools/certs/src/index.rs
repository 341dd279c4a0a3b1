//! The index of what a CA issued ([`INDEX_FILE`] in its folder): one
//! entry per certificate, oldest first, and the number of its latest CRL.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bitfold_net::tls::Role;
use serde::{Deserialize, Serialize};

use crate::files::{self, PUBLIC, parse_utc, utc};
use crate::{Error, INDEX_FILE};

/// One certificate a CA issued, as its index records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// Its holder's name (its CommonName).
    pub name: String,
    /// The role its SAN URI names.
    pub role: Role,
    /// Its serial number, in hex.
    pub serial: String,
    /// When it starts being valid.
    pub not_before: SystemTime,
    /// When it stops being valid.
    pub not_after: SystemTime,
    /// The TLS folder it was written to (absolute).
    pub folder: PathBuf,
    /// When it was revoked, if it was.
    pub revoked: Option<SystemTime>,
}

impl Issued {
    /// What it is at `now`: revoked, else expired past its not-after, else valid.
    pub fn state(&self, now: SystemTime) -> State {
        if self.revoked.is_some() {
            State::Revoked
        } else if now > self.not_after {
            State::Expired
        } else {
            State::Valid
        }
    }
}

/// What a certificate is at some time ([`Issued::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Neither revoked nor past its not-after.
    Valid,
    /// Past its not-after (and not revoked).
    Expired,
    /// Revoked: in its CA's CRL.
    Revoked,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Valid => "valid",
            State::Expired => "expired",
            State::Revoked => "revoked",
        })
    }
}

/// The index, in memory.
#[derive(Debug, Clone, Default)]
pub(crate) struct Index {
    /// The number of the CA's latest CRL.
    pub(crate) crl_number: u64,
    /// Every certificate, oldest first.
    pub(crate) issued: Vec<Issued>,
}

/// The index as its file holds it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexFile {
    crl_number: u64,
    #[serde(default)]
    issued: Vec<Entry>,
}

/// One certificate as the file holds it (dates as [`utc`] writes them).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    role: String,
    serial: String,
    not_before: String,
    not_after: String,
    folder: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revoked: Option<String>,
}

/// The comment at the top of the file.
const HEADER: &str = "# Every certificate this CA issued, oldest first (`bitfold certs`). \
                      crl_number is that of crl.pem.\n";

impl Index {
    /// Reads the index in the CA folder `dir`.
    pub(crate) fn load(dir: &Path) -> Result<Index, Error> {
        let path = dir.join(INDEX_FILE);
        let text = files::read(&path)?;
        let corrupt = |cause: String| Error::Corrupt {
            path: path.clone(),
            cause,
        };
        let file: IndexFile = toml::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        let issued = file
            .issued
            .into_iter()
            .map(|entry| {
                let date = |text: &str| {
                    parse_utc(text).ok_or_else(|| {
                        corrupt(format!(
                            "`{text}` (of {}) is not a date like 2027-05-01T12:00:00Z",
                            entry.name
                        ))
                    })
                };
                Ok(Issued {
                    role: Role::named(&entry.role).ok_or_else(|| {
                        corrupt(format!(
                            "`{}` (of {}) is not a role",
                            entry.role, entry.name
                        ))
                    })?,
                    not_before: date(&entry.not_before)?,
                    not_after: date(&entry.not_after)?,
                    revoked: entry.revoked.as_deref().map(date).transpose()?,
                    name: entry.name,
                    serial: entry.serial,
                    folder: entry.folder,
                })
            })
            .collect::<Result<_, Error>>()?;
        Ok(Index {
            crl_number: file.crl_number,
            issued,
        })
    }

    /// Writes the index to the CA folder `dir`, replacing the file at once.
    pub(crate) fn save(&self, dir: &Path) -> Result<(), Error> {
        let path = dir.join(INDEX_FILE);
        let file = IndexFile {
            crl_number: self.crl_number,
            issued: self
                .issued
                .iter()
                .map(|issued| Entry {
                    name: issued.name.clone(),
                    role: issued.role.name().to_owned(),
                    serial: issued.serial.clone(),
                    not_before: utc(issued.not_before),
                    not_after: utc(issued.not_after),
                    folder: issued.folder.clone(),
                    revoked: issued.revoked.map(utc),
                })
                .collect(),
        };
        let text = toml::to_string(&file).map_err(|e| Error::Corrupt {
            path: path.clone(),
            cause: e.to_string(),
        })?;
        files::replace(&path, &format!("{HEADER}{text}"), PUBLIC)
    }
}
