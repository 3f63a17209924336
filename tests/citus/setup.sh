#!/usr/bin/env bash
# Citus, for the tests on a Citus cluster (tests/citus), run by the README's test command
# (tests/run.sh) and so by .ci/run; running chime needs none of it. Citus is not in the
# package registries this machine reaches, so it is built from its release source: its
# build.sh installs the build dependencies with apt-get and the extension into PostgreSQL
# 15 (a few minutes on 2 cores, once). No copy of Citus goes into the repository. Users
# install Citus's own packages (docs/book/src/citus.md).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
pg15_config=/usr/lib/postgresql/15/bin/pg_config
if ! [ -f "$("$pg15_config" --sharedir)/extension/citus.control" ] || ! [ -f "$("$pg15_config" --pkglibdir)/citus.so" ]; then
    # Beside this checkout, or beside the one it was cloned from (a CI clone made elsewhere),
    # or where CHIME_CITUS_SOURCE says.
    origin="$(git -C "$root" remote get-url origin 2>/dev/null || true)"
    candidates=("${CHIME_CITUS_SOURCE:-}" "$root/../shared/citus")
    case $origin in /*) candidates+=("$origin/../shared/citus");; esac
    citus_src=""
    for c in "${candidates[@]}"; do
        if [ -n "$c" ] && [ -f "$c/build.sh" ]; then citus_src="$c"; break; fi
    done
    if [ -z "$citus_src" ]; then
        echo "error: the citus extension is not installed in PostgreSQL 15, and its source (build.sh with the Citus 13.2.2 release) is in none of: ${candidates[*]}; put it in ../shared/citus beside the checkout, set CHIME_CITUS_SOURCE, or install Citus for PostgreSQL 15 yourself" >&2
        exit 1
    fi
    echo "building and installing Citus from $citus_src (a few minutes)" >&2
    if [ "$(id -u)" -eq 0 ]; then
        PG_CONFIG="$pg15_config" bash "$citus_src/build.sh" >&2
    else
        sudo env PG_CONFIG="$pg15_config" bash "$citus_src/build.sh" >&2
    fi
fi
