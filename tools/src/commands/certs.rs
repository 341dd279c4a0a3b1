//! `bitfold certs`: a kept CA, and the certificates it issues and revokes
//! (the work is `bitfold_certs`'s; this prints what it did).

use bitfold_certs::{Authority, CA_KEY_FILE, default_days, utc};
use bitfold_net::tls::CRL_FILE;

use crate::cli::{CertsArgs, CertsCommand};

/// Runs one `bitfold certs` subcommand.
pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    match args.command {
        CertsCommand::Init(args) => {
            let ca = Authority::init(&args.ca, args.days)?;
            println!(
                "made a CA in {}, valid until {}",
                args.ca.display(),
                utc(ca.not_after())
            );
            println!(
                "its key is {}: keep it secret and backed up",
                args.ca.join(CA_KEY_FILE).display()
            );
            println!(
                "next: bitfold certs issue --ca {} --role ROLE --name NAME --out DIR",
                args.ca.display()
            );
        }
        CertsCommand::Issue(args) => {
            let mut ca = Authority::open(&args.ca)?;
            let days = args.days.unwrap_or(default_days(args.role));
            let issued = ca.issue(args.role, &args.name, days, &args.out)?;
            println!(
                "issued {} certificate for {}, serial {}, valid until {}, in {}",
                issued.role.with_article(),
                issued.name,
                issued.serial,
                utc(issued.not_after),
                issued.folder.display()
            );
        }
        CertsCommand::Revoke(args) => {
            let mut ca = Authority::open(&args.ca)?;
            let revocation = ca.revoke(&args.name)?;
            let crl = args.ca.join(CRL_FILE);
            let count = revocation.revoked.len();
            let serials: Vec<&str> = revocation
                .revoked
                .iter()
                .map(|i| i.serial.as_str())
                .collect();
            println!(
                "{} {count} certificate{} of {} (serial {}); {} lists {}",
                if revocation.newly == 0 {
                    "already revoked:"
                } else {
                    "revoked"
                },
                if count == 1 { "" } else { "s" },
                args.name,
                serials.join(", "),
                crl.display(),
                if count == 1 { "it" } else { "them" }
            );
            for folder in &revocation.refreshed {
                println!("refreshed {}", folder.join(CRL_FILE).display());
            }
            for (folder, why) in &revocation.skipped {
                println!("left {} alone: {why}", folder.display());
            }
            println!(
                "copy {} into the TLS folder of every process of this CA elsewhere (other \
                 machines): until it has the new list, it accepts {}",
                crl.display(),
                args.name
            );
        }
        CertsCommand::List(args) => {
            let ca = Authority::open(&args.ca)?;
            let now = std::time::SystemTime::now();
            let width = ca.issued().iter().map(|i| i.name.len()).max().unwrap_or(0);
            if ca.issued().is_empty() {
                println!("the CA in {} has issued no certificate", args.ca.display());
            }
            for issued in ca.issued() {
                println!(
                    "{:width$}  {:6}  {}  {}",
                    issued.name,
                    issued.role.name(),
                    utc(issued.not_after),
                    issued.state(now)
                );
            }
        }
    }
    Ok(())
}
