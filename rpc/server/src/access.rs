//! Who may call what (docs/protocol.md §11). Over TLS, every connection's
//! peer is known by its certificate's [`Role`]; each method names the roles
//! that may call it, and a call by any other, or with a certificate revoked
//! or expired since the connection opened, is refused with a message that
//! starts `forbidden:` and names the role it needs. Without TLS nothing is
//! known of the peer and every call is allowed.

use std::time::Duration;

use crate::net::Peer;
use crate::tls::{Role, Tls};

/// The master's methods that read the index: `query`, `placement`, `status`.
pub(crate) const READ: &[Role] = &[Role::Reader, Role::Admin];
/// The master's methods that change it: `import`, `clear`, `delete`, `rebalance`.
pub(crate) const CHANGE: &[Role] = &[Role::Admin];
/// `Master.raft`: only the other masters call it.
pub(crate) const MASTERS: &[Role] = &[Role::Master];
/// Every slave method: only the master and other slaves call them.
pub(crate) const CLUSTER: &[Role] = &[Role::Master, Role::Slave];

/// The peer of one connection, as a server's methods see it.
pub(crate) struct Caller {
    peer: Peer,
    /// The server's TLS configuration, for the revocation list as it is now.
    tls: Option<Tls>,
}

impl Caller {
    /// The caller at the far end of a connection accepted with `tls`.
    pub(crate) fn new(peer: &Peer, tls: Option<&Tls>) -> Caller {
        Caller {
            peer: peer.clone(),
            tls: tls.cloned(),
        }
    }

    /// Its role, as a metrics label: `none` without TLS.
    pub(crate) fn role_label(&self) -> &'static str {
        self.peer
            .identity
            .as_ref()
            .map_or("none", |id| id.role.name())
    }

    /// Whether it may call `method`, which `roles` may call: if not, why,
    /// in a line that starts `forbidden:`.
    pub(crate) fn may(&self, method: &str, roles: &[Role]) -> Result<(), String> {
        let (Some(tls), Some(identity)) = (&self.tls, &self.peer.identity) else {
            return Ok(());
        };
        // Checked on every call: the message is made only for a refusal.
        let needs = || format!("`{method}` needs {}", role_names(roles));
        let from = self.peer.addr;
        if tls.is_revoked(identity) {
            return Err(format!(
                "forbidden: {identity} (from {from}) has been revoked; {} that is not",
                needs()
            ));
        }
        if identity.expires_in() == Duration::ZERO {
            return Err(format!(
                "forbidden: {identity} (from {from}) has expired; {} that has not \
                 (`bitfold certs issue` makes a new one)",
                needs()
            ));
        }
        if roles.contains(&identity.role) {
            Ok(())
        } else {
            Err(format!(
                "forbidden: {}, and {from} called it with {identity}",
                needs()
            ))
        }
    }
}

/// `an admin certificate`, `a reader or admin certificate`.
fn role_names(roles: &[Role]) -> String {
    let Some((first, rest)) = roles.split_first() else {
        return "a certificate".to_owned();
    };
    let mut names = first.with_article();
    for role in rest {
        names.push_str(" or ");
        names.push_str(role.name());
    }
    names + " certificate"
}

/// Refuses to start a server of `role` with `tls` of another role.
pub(crate) fn require(tls: Option<&Tls>, role: Role) -> Result<(), crate::Error> {
    let Some(tls) = tls else {
        return Ok(());
    };
    let identity = tls.identity();
    if identity.role == role {
        return Ok(());
    }
    Err(crate::Error::WrongRole {
        cert: tls.cert().to_owned(),
        identity: Box::new(identity),
        needs: role,
    })
}
