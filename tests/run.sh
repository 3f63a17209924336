#!/usr/bin/env bash
# The README's test command: installs what the suite needs when missing (tests/setup.sh,
# and Citus for tests/citus), then runs it. Arguments go to `cargo test` (a test binary, a
# filter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
bash tests/citus/setup.sh
cargo test "$@"
