//! One DBMS connection's view of the master: each call is checked against
//! the caller's role ([`crate::access`]) before the master answers it. A
//! refused call is answered with the error kind `forbidden` where the
//! method's result has an error (a bare capnp error where it has none),
//! counted, and changes nothing.

use std::rc::Rc;

use crate::access::{self, Caller};
use crate::bitfold_capnp::master;
use crate::tls::Role;
use bitfold_proto::ErrorKind;

use super::Master;
use super::reply::Failure;

/// The master, as one connection's caller may call it.
pub(super) struct Guarded {
    pub(super) master: Rc<Master>,
    pub(super) caller: Caller,
}

impl Guarded {
    /// The `forbidden` error if the caller may not call `method`, which
    /// `roles` may; counted and logged.
    fn refused(&self, method: &'static str, roles: &[Role]) -> Option<Failure> {
        let why = self.caller.may(method, roles).err()?;
        tracing::info!("{why}");
        let role = self.caller.role_label();
        self.master.metrics.forbidden.count(method, role);
        Some(Failure::new(ErrorKind::Forbidden, why))
    }

    /// The refusal of a method whose result has no error field.
    fn refused_bare(&self, method: &'static str, roles: &[Role]) -> Result<(), capnp::Error> {
        match self.refused(method, roles) {
            Some(failure) => Err(capnp::Error::failed(failure.message)),
            None => Ok(()),
        }
    }
}

impl master::Server for Guarded {
    async fn query(
        self: Rc<Self>,
        params: master::QueryParams,
        mut results: master::QueryResults,
    ) -> Result<(), capnp::Error> {
        if let Some(failure) = self.refused("query", access::READ) {
            failure.write(results.get().init_result().init_error());
            return Ok(());
        }
        master::Server::query(self.master.clone(), params, results).await
    }

    async fn import(
        self: Rc<Self>,
        params: master::ImportParams,
        mut results: master::ImportResults,
    ) -> Result<(), capnp::Error> {
        if let Some(failure) = self.refused("import", access::CHANGE) {
            failure.write(results.get().init_outcome().init_error());
            return Ok(());
        }
        master::Server::import(self.master.clone(), params, results).await
    }

    async fn status(
        self: Rc<Self>,
        params: master::StatusParams,
        results: master::StatusResults,
    ) -> Result<(), capnp::Error> {
        self.refused_bare("status", access::READ)?;
        master::Server::status(self.master.clone(), params, results).await
    }

    async fn clear(
        self: Rc<Self>,
        params: master::ClearParams,
        mut results: master::ClearResults,
    ) -> Result<(), capnp::Error> {
        if let Some(failure) = self.refused("clear", access::CHANGE) {
            failure.write(results.get().init_outcome().init_error());
            return Ok(());
        }
        master::Server::clear(self.master.clone(), params, results).await
    }

    async fn delete(
        self: Rc<Self>,
        params: master::DeleteParams,
        mut results: master::DeleteResults,
    ) -> Result<(), capnp::Error> {
        if let Some(failure) = self.refused("delete", access::CHANGE) {
            failure.write(results.get().init_outcome().init_error());
            return Ok(());
        }
        master::Server::delete(self.master.clone(), params, results).await
    }

    async fn rebalance(
        self: Rc<Self>,
        params: master::RebalanceParams,
        mut results: master::RebalanceResults,
    ) -> Result<(), capnp::Error> {
        if let Some(failure) = self.refused("rebalance", access::CHANGE) {
            failure.write(results.get().init_outcome().init_error());
            return Ok(());
        }
        master::Server::rebalance(self.master.clone(), params, results).await
    }

    async fn placement(
        self: Rc<Self>,
        params: master::PlacementParams,
        results: master::PlacementResults,
    ) -> Result<(), capnp::Error> {
        self.refused_bare("placement", access::READ)?;
        master::Server::placement(self.master.clone(), params, results).await
    }
}
