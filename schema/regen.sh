#!/bin/sh
# Regenerates rpc/proto/src/bitfold_capnp.rs from schema/bitfold.capnp.
#
# Needs the Cap'n Proto compiler (Debian: `apt-get install capnproto`) and
# installs the Rust plugin `capnpc-rust` from the `capnpc` crate, at the
# version in Cargo.lock, under target/capnpc. The generated file is
# committed, so a fresh clone builds with cargo alone; the test
# `cargo test -p bitfold-proto --test schema` fails when it is stale.
set -eu
cd "$(dirname "$0")/.."
command -v capnp >/dev/null || {
    echo "error: the Cap'n Proto compiler is missing; install it with: apt-get install capnproto" >&2
    exit 1
}
version=$(awk '/^name = "capnpc"$/ { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)
root=target/capnpc
if [ "$(cat "$root/version" 2>/dev/null)" != "$version" ]; then
    cargo install --quiet --locked --root "$root" "capnpc@$version"
    echo "$version" >"$root/version"
fi
capnp compile --src-prefix=schema -o "$root/bin/capnpc-rust:rpc/proto/src" schema/bitfold.capnp
echo "regenerated rpc/proto/src/bitfold_capnp.rs with capnpc $version"
