//! The flags of `bitfold certs` and its subcommands, with their help text.

use std::path::PathBuf;

use bitfold_net::tls::Role;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};

/// `bitfold certs`.
#[derive(Debug, Args)]
#[command(after_help = CERTS_EXAMPLES)]
pub struct CertsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: CertsCommand,
}

const CERTS_EXAMPLES: &str = "\
Examples:
  bitfold certs init --ca ca
  bitfold certs issue --ca ca --role slave --name s0 --out tls/s0
  bitfold certs issue --ca ca --role reader --name dashboards --out tls/dashboards
  bitfold certs revoke --ca ca --name dashboards    # then copy ca/crl.pem elsewhere
  bitfold certs list --ca ca";

/// The subcommands of `bitfold certs`.
#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make a new CA in CA_DIR (refused if it holds one).
    ///
    /// Writes ca.pem (its certificate), ca-key.pem (its key, mode 0600: keep
    /// it secret and backed up), crl.pem (its revocation list, empty) and
    /// issued.toml (the index of what it issues); CA_DIR is made mode 0700.
    Init(CertsInitArgs),
    /// Issue a certificate of a role for a name, written as the TLS folder OUT.
    ///
    /// OUT gets ca.pem (the CA's certificate), cert.pem, key.pem (mode 0600,
    /// OUT made or narrowed to 0700) and crl.pem (a copy of the CA's list),
    /// each replacing what was there at once, and CA_DIR/issued.toml records
    /// it. A master's or slave's certificate carries the names bitfold,
    /// localhost and 127.0.0.1, and may serve and dial; an admin's or
    /// reader's may only dial. Issuing a name again (a renewal) adds a
    /// certificate; the earlier one stays valid until it expires or is revoked.
    Issue(CertsIssueArgs),
    /// Revoke every certificate of a name.
    ///
    /// CA_DIR/crl.pem then lists their serials, and so does crl.pem in every
    /// TLS folder on this machine that the CA wrote and that still holds its
    /// ca.pem (replaced at once; servers re-read it every few seconds). Copy
    /// CA_DIR/crl.pem into the TLS folder of every process elsewhere (other
    /// machines, moved folders): until it has the new list, it still accepts
    /// the revoked certificates.
    Revoke(CertsRevokeArgs),
    /// List every certificate the CA issued, oldest first: name, role, not-after (UTC), state.
    ///
    /// The state is `valid`, `expired` (past its not-after) or `revoked`.
    List(CertsListArgs),
}

/// `bitfold certs init`.
#[derive(Debug, Args)]
pub struct CertsInitArgs {
    /// The CA's folder to make (its parents too).
    #[arg(long, value_name = "CA_DIR")]
    pub ca: PathBuf,
    /// Days the CA is valid; no certificate it issues may outlive it.
    #[arg(long, value_name = "N", default_value_t = bitfold_certs::DEFAULT_CA_DAYS, value_parser = clap::value_parser!(u32).range(1..))]
    pub days: u32,
}

/// `bitfold certs issue`.
#[derive(Debug, Args)]
pub struct CertsIssueArgs {
    /// The CA's folder (made by `bitfold certs init`).
    #[arg(long, value_name = "CA_DIR")]
    pub ca: PathBuf,
    /// What the holder may do; the certificate names it (SAN URI bitfold://role/ROLE).
    #[arg(long, value_parser = role())]
    pub role: Role,
    /// The holder's name: the certificate's CommonName, and what `revoke` and `list` name.
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// Days it is valid [default: 365 for master and slave, 90 for admin and reader]; it may not outlive the CA.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub days: Option<u32>,
    /// The TLS folder to write, as the holder's `--tls DIR` takes it.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// `bitfold certs revoke`.
#[derive(Debug, Args)]
pub struct CertsRevokeArgs {
    /// The CA's folder.
    #[arg(long, value_name = "CA_DIR")]
    pub ca: PathBuf,
    /// The name whose every certificate to revoke.
    #[arg(long, value_name = "NAME")]
    pub name: String,
}

/// `bitfold certs list`.
#[derive(Debug, Args)]
pub struct CertsListArgs {
    /// The CA's folder.
    #[arg(long, value_name = "CA_DIR")]
    pub ca: PathBuf,
}

/// The parser of `--role`: the four roles, each listed in `--help` with what it may do.
fn role() -> impl TypedValueParser<Value = Role> {
    let values = Role::ALL.map(|role| {
        PossibleValue::new(role.name()).help(match role {
            Role::Master => "the master: serves clients, dials slaves",
            Role::Slave => "a slave: serves the master and slaves, dials slaves",
            Role::Admin => {
                "a client that may change the index (import, delete, rebalance) and read it"
            }
            Role::Reader => "a client that may only read the index (query, status)",
        })
    });
    PossibleValuesParser::new(values)
        .map(|name| Role::named(&name).expect("clap accepts only the roles"))
}
