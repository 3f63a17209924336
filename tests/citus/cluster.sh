#!/usr/bin/env bash
# A Citus cluster on this machine, by hand, for trying chime on it and for `chime bench`
# against it (docs/book/src/citus.md, Figures): a coordinator and N workers (0 to 2), each a
# PostgreSQL 15 with citus preloaded, over Unix sockets in DIR; a database `chime` with the
# extension on each and the workers registered. The tests start theirs themselves
# (cluster.rs); this is the same setup as a script.
#
#   bash tests/citus/cluster.sh start DIR WORKERS   # prints the coordinator's URL
#   bash tests/citus/cluster.sh stop DIR
#
# Run as root, the servers run as the `postgres` user.
set -euo pipefail
BIN=/usr/lib/postgresql/15/bin
cmd=${1:?start or stop}
dir=${2:?a directory}
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "$cmd" in
start)
    workers=${3:?how many workers}
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    nodes=(coordinator)
    for n in $(seq 1 "$workers"); do nodes+=("worker$n"); done
    for node in "${nodes[@]}"; do
        as_pg mkdir -p "$dir/$node"
        as_pg "$BIN/initdb" -D "$dir/$node/data" -A trust -U postgres >/dev/null
        cat >>"$dir/$node/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir/$node'
citus.local_hostname = '$dir/$node'
shared_preload_libraries = 'citus'
citus.shard_count = 4
wal_level = logical
max_worker_processes = 64
max_logical_replication_workers = 16
max_replication_slots = 32
max_wal_senders = 32
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
        as_pg "$BIN/pg_ctl" -D "$dir/$node/data" -l "$dir/$node/log" -w start >/dev/null
        as_pg "$BIN/psql" -qX -h "$dir/$node" -U postgres -c 'CREATE DATABASE chime' >/dev/null
        as_pg "$BIN/psql" -qX -h "$dir/$node" -U postgres -d chime -c 'CREATE EXTENSION citus' >/dev/null
    done
    psql_c() { as_pg "$BIN/psql" -qXAt -h "$dir/coordinator" -U postgres -d chime -c "$1" >/dev/null; }
    psql_c "SELECT citus_set_coordinator_host('$dir/coordinator', 5432)"
    for n in $(seq 1 "$workers"); do psql_c "SELECT citus_add_node('$dir/worker$n', 5432)"; done
    echo "postgres://postgres@localhost/chime?host=$dir/coordinator"
    ;;
stop)
    for data in "$dir"/*/data; do as_pg "$BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null || true; done
    ;;
*)
    echo "usage: $0 start DIR WORKERS | stop DIR" >&2
    exit 2
    ;;
esac
