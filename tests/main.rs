//! Process-level tests: real `bitfold` slaves and masters on loopback,
//! driven through the CLI and the client library, every answer checked
//! against a local oracle. One test binary (see README.md beside this file).

mod oracle;
mod util;

mod admission;
mod bench;
mod certs;
mod cli;
mod cluster;
mod exactness;
mod failover;
mod failures;
mod faults;
mod index;
mod limits;
mod masters;
mod membership;
mod metrics;
mod roles;
mod sample;
mod tls;
mod updates;
