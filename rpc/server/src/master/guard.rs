//! One DBMS connection's view of the master: each call is checked against
//! the caller's role ([`crate::access`]) before the master answers it. A
//! refused call is answered with the error kind `forbidden` where the
//! method's result has an error (a bare capnp error where it has none),
//! counted, and changes nothing. A call that passes goes to the master
//! serving now ([`Serving`]); on a master of several that does not lead, it
//! is sent on to the leader, once (the leader's master is told, by
//! `forwarding`, not to send it on again); `raft`, from another master,
//! goes to its Raft node.

use std::cell::Cell;
use std::rc::Rc;

use crate::access::{self, Caller};
use crate::bitfold_capnp::master;
use crate::tls::Role;
use bitfold_proto::ErrorKind;

use super::reply::Failure;
use super::serving::Serving;

/// The master, as one connection's caller may call it.
pub(super) struct Guarded {
    pub(super) serving: Rc<Serving>,
    pub(super) caller: Caller,
    /// Whether another master forwards its clients' calls on this
    /// connection (it called `forwarding`): they are not forwarded again.
    pub(super) forwarded: Cell<bool>,
}

impl Guarded {
    /// The `forbidden` error if the caller may not call `method`, which
    /// `roles` may; counted and logged.
    fn refused(&self, method: &'static str, roles: &[Role]) -> Option<Failure> {
        // A forwarding master checked its own caller's role.
        let roles = if self.forwarded.get() {
            access::MASTERS
        } else {
            roles
        };
        let why = self.caller.may(method, roles).err()?;
        tracing::info!("{why}");
        let role = self.caller.role_label();
        self.serving.metrics().forbidden.count(method, role);
        Some(Failure::new(ErrorKind::Forbidden, why))
    }
}

/// Implements every master method as: check the caller, then let the
/// master answer. A method's `init_*` names where its result keeps an
/// error (the refusal is written there); one without has none, and its
/// refusal fails the call.
macro_rules! checked {
    ($($method:ident($params:ident, $results:ident, $request:ident) by $roles:expr, $($init:ident)?;)*) => {
        impl master::Server for Guarded {
            $(
                async fn $method(
                    self: Rc<Self>,
                    params: master::$params,
                    #[allow(unused_mut)] mut results: master::$results,
                ) -> Result<(), capnp::Error> {
                    if let Some(failure) = self.refused(stringify!($method), $roles) {
                        return checked!(@refuse failure, results $(, $init)?);
                    }
                    let failure = match self.serving.master(stringify!($method)).await {
                        Ok(master) => return master::Server::$method(master, params, results).await,
                        Err(failure) => failure,
                    };
                    // A follower sends the call on to the leader it knows.
                    let leader = match failure.kind {
                        ErrorKind::NotLeader if !self.forwarded.get() => {
                            self.serving.leader_link().await
                        }
                        _ => None,
                    };
                    let Some(leader) = leader else {
                        return checked!(@refuse failure, results $(, $init)?);
                    };
                    // `leader`, the connection, is held until the answer.
                    let mut request = leader.client.$request();
                    request.set(params.get()?)?;
                    match request.send().promise.await {
                        Ok(answer) => results.set(answer.get()?),
                        Err(e) => {
                            self.serving.drop_leader_link(&leader);
                            let failure = Failure::new(
                                ErrorKind::NotLeader,
                                format!("{}; sending the call on to it failed: {e}", failure.message),
                            );
                            checked!(@refuse failure, results $(, $init)?)
                        }
                    }
                }
            )*

            async fn forwarding(
                self: Rc<Self>,
                _: master::ForwardingParams,
                _: master::ForwardingResults,
            ) -> Result<(), capnp::Error> {
                if let Some(failure) = self.refused("forwarding", access::MASTERS) {
                    return Err(capnp::Error::failed(failure.message));
                }
                self.forwarded.set(true);
                Ok(())
            }

            async fn raft(
                self: Rc<Self>,
                params: master::RaftParams,
                mut results: master::RaftResults,
            ) -> Result<(), capnp::Error> {
                if let Some(failure) = self.refused("raft", access::MASTERS) {
                    return Err(capnp::Error::failed(failure.message));
                }
                let reply = self.serving.raft(params.get()?.get_request()?).await;
                results.get().set_reply(&reply.map_err(capnp::Error::failed)?);
                Ok(())
            }
        }
    };
    (@refuse $failure:ident, $results:ident, $init:ident) => {{
        $failure.write($results.get().$init().init_error());
        Ok(())
    }};
    (@refuse $failure:ident, $results:ident) => {
        Err(capnp::Error::failed($failure.message))
    };
}

checked! {
    query(QueryParams, QueryResults, query_request) by access::READ, init_result;
    placement(PlacementParams, PlacementResults, placement_request) by access::READ,;
    status(StatusParams, StatusResults, status_request) by access::READ,;
    import(ImportParams, ImportResults, import_request) by access::CHANGE, init_outcome;
    clear(ClearParams, ClearResults, clear_request) by access::CHANGE, init_outcome;
    delete(DeleteParams, DeleteResults, delete_request) by access::CHANGE, init_outcome;
    rebalance(RebalanceParams, RebalanceResults, rebalance_request) by access::CHANGE, init_outcome;
}
