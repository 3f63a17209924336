#!/usr/bin/env bash
# `chime bench` burst and steady on plain PostgreSQL, on a Citus coordinator with one
# worker and on one with two workers, one after the other in one run on this machine
# (docs/book/src/citus.md, Figures). Each Citus cluster is started by cluster.sh in a
# directory of its own and stopped after; plain PostgreSQL is the bench's own throwaway
# server (the same PostgreSQL 15). Arguments go to `chime bench` (sizes, --runs).
#
#   bash tests/citus/bench.sh --runs 3 --burst-tasks 2000 --steady-rate 100 --steady-secs 10
#
# Uses the chime and chime-bench binaries of target/release, or of target/debug when
# CHIME_BIN_DIR=target/debug.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${CHIME_BIN_DIR:-target/release}
bench=("$bin/chime" bench --scenarios burst,steady --nodes 1 "$@")
base=$(mktemp -d /tmp/chime-citus-bench.XXXXXX)
chmod 755 "$base"
trap 'for d in "$base"/*/; do bash tests/citus/cluster.sh stop "$d"; done; rm -rf "$base"' EXIT

echo "## plain PostgreSQL 15"
env -u DATABASE_URL "${bench[@]}"
for workers in 1 2; do
    echo "## Citus: coordinator + $workers worker(s)"
    url=$(bash tests/citus/cluster.sh start "$base/c$workers" "$workers")
    DATABASE_URL=$url "$bin/chime" migrate
    DATABASE_URL=$url "${bench[@]}"
    bash tests/citus/cluster.sh stop "$base/c$workers"
done
