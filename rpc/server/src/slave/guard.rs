//! One connection's view of a slave: every slave method may be called only
//! by the master and other slaves ([`access::CLUSTER`]); a call by any other
//! role is refused with a capnp error that starts `forbidden:`, counted,
//! and changes nothing.

use std::rc::Rc;

use crate::access::{self, Caller};
use crate::bitfold_capnp::slave;

use super::Slave;

/// The slave, as one connection's caller may call it.
pub(super) struct Guarded {
    pub(super) slave: Rc<Slave>,
    pub(super) caller: Caller,
}

impl Guarded {
    /// Refuses the call of `method` unless the caller is the master or a slave.
    fn check(&self, method: &'static str) -> Result<(), capnp::Error> {
        let Err(why) = self.caller.may(method, access::CLUSTER) else {
            return Ok(());
        };
        tracing::info!("{why}");
        let role = self.caller.role_label();
        self.slave.metrics.forbidden.count(method, role);
        Err(capnp::Error::failed(why))
    }
}

/// Implements every slave method as: check the caller, then let the slave answer.
macro_rules! checked {
    ($($method:ident($params:ident, $results:ident);)*) => {
        impl slave::Server for Guarded {
            $(
                async fn $method(
                    self: Rc<Self>,
                    params: slave::$params,
                    results: slave::$results,
                ) -> Result<(), capnp::Error> {
                    self.check(stringify!($method))?;
                    slave::Server::$method(self.slave.clone(), params, results).await
                }
            )*
        }
    };
}

checked! {
    handle(HandleParams, HandleResults);
    coordinate(CoordinateParams, CoordinateResults);
    fetch(FetchParams, FetchResults);
    import(ImportParams, ImportResults);
    health(HealthParams, HealthResults);
    catalog(CatalogParams, CatalogResults);
    gather(GatherParams, GatherResults);
    update(UpdateParams, UpdateResults);
    fetch_many(FetchManyParams, FetchManyResults);
    pull(PullParams, PullResults);
    commit(CommitParams, CommitResults);
}
