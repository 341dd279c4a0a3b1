//! A cluster's certificate authority, kept in a folder, and the
//! certificates it issues and revokes, written as the TLS folders bitfold's
//! processes read ([`bitfold_net::tls`]): each holds the CA's certificate
//! (`ca.pem`), one holder's certificate and key (`cert.pem`, `key.pem`,
//! the key 0600 and the folder 0700) and the CA's revocation list
//! (`crl.pem`).
//!
//! [`Authority`] is a kept CA (`bitfold certs init`, `issue`, `revoke`,
//! `list`). Every certificate names its holder's [`Role`] by one SAN URI
//! ([`Role::uri`]), expires ([`default_days`]), and can be revoked: the
//! CA's `crl.pem` then lists it, and revoking refreshes the copy in every
//! folder on this machine that the CA wrote. [`cluster_set`] makes the
//! folders of a local cluster (`bitfold up --tls`, `bitfold bench --tls`).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod authority;
mod files;
mod index;

use std::path::{Path, PathBuf};

use bitfold_net::tls::{CERT_FILE, Role};

pub use authority::{Authority, Revocation};
pub use files::utc;
pub use index::{Issued, State};

/// The CA's key in its folder (mode 0600).
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The index of what a CA issued, in its folder.
pub const INDEX_FILE: &str = "issued.toml";

/// Days a new CA is valid when not told.
pub const DEFAULT_CA_DAYS: u32 = 3650;

/// Days a certificate of `role` is valid when not told: a year for a node
/// (master, slave), 90 days for a client (admin, reader).
pub fn default_days(role: Role) -> u32 {
    if role.is_node() { 365 } else { 90 }
}

/// In a cluster's set ([`cluster_set`]): the kept CA's folder.
pub const CLUSTER_CA: &str = "ca";
/// In a cluster's set: the master's TLS folder (and its certificate's name).
pub const MASTER: &str = "master";
/// In a cluster's set: the client folder that may do anything (imports,
/// deletes, rebalance, queries).
pub const ADMIN: &str = "admin";
/// In a cluster's set: the client folder that may only read (queries, status).
pub const READER: &str = "reader";

/// Why certificates could not be made, written or revoked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rcgen could not make a key, a certificate or a list.
    #[error("cannot make {what}: {cause}")]
    Make {
        /// What was being made.
        what: String,
        /// What rcgen said.
        cause: String,
    },
    /// A file or folder could not be written.
    #[error("cannot write {}: {cause}", path.display())]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// What the system said.
        cause: String,
    },
    /// A file could not be read.
    #[error("cannot read {}: {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        cause: String,
    },
    /// A file of a CA folder holds what it should not.
    #[error("cannot use {}: {cause}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        cause: String,
    },
    /// The folder holds no CA.
    #[error("no CA in {dir}: `bitfold certs init --ca {dir}` makes one", dir = dir.display())]
    NoCa {
        /// The folder.
        dir: PathBuf,
    },
    /// `init` was given a folder that already holds a CA.
    #[error(
        "{dir} already holds a CA: issue with it (`bitfold certs issue --ca {dir} ...`), \
         or give `init` another folder",
        dir = dir.display()
    )]
    CaExists {
        /// The folder.
        dir: PathBuf,
    },
    /// A validity of no days, or of so many that it ends past the year 9999.
    #[error("a validity of {days} days: give at least 1, ending before the year 10000")]
    Days {
        /// The days asked for.
        days: u32,
    },
    /// A validity that ends before it starts.
    #[error("a certificate valid from {not_before} to {not_after} ends before it starts")]
    Validity {
        /// Its start.
        not_before: String,
        /// Its end.
        not_after: String,
    },
    /// A certificate would be valid after its CA.
    #[error(
        "a certificate valid until {not_after} would outlive the CA in {dir}, valid until \
         {ca_not_after}: ask for at most {days} days (--days), or make a new CA \
         (`bitfold certs init`)",
        dir = dir.display()
    )]
    OutlivesCa {
        /// The CA's folder.
        dir: PathBuf,
        /// The end asked for.
        not_after: String,
        /// The CA's own end.
        ca_not_after: String,
        /// The most days a certificate issued now can have.
        days: u64,
    },
    /// A name that holds a valid certificate of another role.
    #[error(
        "{name} holds a valid {role} certificate of the CA in {dir}: a name has one role; \
         revoke it first (`bitfold certs revoke --ca {dir} --name {name}`) or pick another name",
        dir = dir.display()
    )]
    OtherRole {
        /// The name.
        name: String,
        /// The role of its valid certificate.
        role: Role,
        /// The CA's folder.
        dir: PathBuf,
    },
    /// `revoke` was given a name the CA issued nothing to.
    #[error(
        "the CA in {dir} issued no certificate named {name}: `bitfold certs list --ca {dir}` \
         lists those it did",
        dir = dir.display()
    )]
    UnknownName {
        /// The name.
        name: String,
        /// The CA's folder.
        dir: PathBuf,
    },
    /// A name no certificate can carry.
    #[error("`{name}` cannot name a certificate: {why}")]
    BadName {
        /// The name.
        name: String,
        /// Why not.
        why: &'static str,
    },
    /// A cluster's TLS folder written by an earlier bitfold, whose CA was not kept.
    #[error(
        "{dir} holds TLS folders of an earlier bitfold (a `client` folder, or no kept CA in \
         `{CLUSTER_CA}/`): remove {dir} to have a new set made, whose clients use `{ADMIN}/` \
         (any command) or `{READER}/` (queries only)",
        dir = dir.display()
    )]
    OldClusterSet {
        /// The folder.
        dir: PathBuf,
    },
}

/// What [`cluster_set`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSet {
    /// Whether it made the CA (else it used the one kept in `DIR/ca`).
    pub new_ca: bool,
    /// The certificates it issued, each in the folder of its name.
    pub issued: Vec<Issued>,
}

/// The TLS folders of a local cluster under `dir`: the kept CA in
/// `dir/ca` ([`CLUSTER_CA`]), a node folder for the master (`dir/master`,
/// role master) and for each of `slaves` (`dir/NAME`, role slave), and the
/// client folders `dir/admin` and `dir/reader`, each certificate named as
/// its folder and valid for [`default_days`].
///
/// Where `dir/ca` already holds a CA, only the folders that lack a
/// certificate are issued (so a slave added to the cluster gets one); a
/// `dir` that holds anything else (the set of an earlier bitfold) is refused.
pub fn cluster_set(dir: &Path, slaves: &[&str]) -> Result<ClusterSet, Error> {
    let ca_dir = dir.join(CLUSTER_CA);
    let kept = ca_dir.join(CA_KEY_FILE).exists();
    let holds_anything = std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if dir.join("client").exists() || (holds_anything && !kept) {
        return Err(Error::OldClusterSet {
            dir: dir.to_owned(),
        });
    }
    let reserved = [CLUSTER_CA, MASTER, ADMIN, READER];
    if let Some(name) = slaves.iter().find(|name| reserved.contains(name)) {
        return Err(Error::BadName {
            name: (*name).to_owned(),
            why: "a slave's folder would be one the cluster's set keeps for its CA, master or clients",
        });
    }
    files::private_dir(dir)?;
    let mut authority = if kept {
        Authority::open(&ca_dir)?
    } else {
        Authority::init(&ca_dir, DEFAULT_CA_DAYS)?
    };
    let folders = [(Role::Master, MASTER)]
        .into_iter()
        .chain(slaves.iter().map(|name| (Role::Slave, *name)))
        .chain([(Role::Admin, ADMIN), (Role::Reader, READER)]);
    let mut issued = Vec::new();
    for (role, name) in folders {
        let folder = dir.join(name);
        if !folder.join(CERT_FILE).exists() {
            issued.push(authority.issue(role, name, default_days(role), &folder)?);
        }
    }
    Ok(ClusterSet {
        new_ca: !kept,
        issued,
    })
}

/// What `f` reads from the certificate `pem`, or why it cannot be read.
pub(crate) fn read_certificate<T>(
    pem: &str,
    f: impl FnOnce(&x509_parser::certificate::X509Certificate<'_>) -> T,
) -> Result<T, String> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| format!("not PEM: {e}"))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| format!("not a certificate: {e}"))?;
    Ok(f(&cert))
}

#[cfg(test)]
mod tests;
