#!/usr/bin/env bash
# Runs the client libraries' test suites against a real `chime serve` (embedded database):
#   clients/test.sh                      all three
#   clients/test.sh python|php|typescript  one or some of them
# Builds chime if needed and installs what the suites need (php-cli and php-curl from
# Debian, the TypeScript build's npm packages). Each suite makes its own biz types and
# tokens through the admin API, with the admin token made here, and its own receiver.
# CHIME_BIN=<binary> tests another build of chime; PYTHON=<interpreter> another Python.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(python php typescript)
for suite in "${suites[@]}"; do
    case $suite in python|php|typescript) ;; *) echo "error: unknown suite '$suite' (python, php or typescript)" >&2; exit 2;; esac
done
wants() { [[ " ${suites[*]} " == *" $1 "* ]]; }

missing=()
if wants php; then
    command -v php >/dev/null || missing+=(php-cli)
    { command -v php >/dev/null && php -r 'exit(extension_loaded("curl") ? 0 : 1);'; } || missing+=(php-curl)
fi
if wants typescript; then
    command -v node >/dev/null || missing+=(nodejs)
    command -v npm >/dev/null || missing+=(npm)
fi
if wants python; then command -v python3 >/dev/null || missing+=(python3); fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}" >&2
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
if wants php; then php -r 'exit(extension_loaded("curl") ? 0 : 1);' || { echo "error: PHP's curl extension is still missing (Debian package php-curl)" >&2; exit 1; }; fi

# CHIME_BIN: test against another chime binary (another branch's build) instead.
if [ -n "${CHIME_BIN:-}" ]; then
    chime=$CHIME_BIN
else
    cargo build --quiet --bin chime
    chime="${CARGO_TARGET_DIR:-$root/target}/debug/chime"
fi

# One chime for all suites, on a free port, with a throwaway data directory. As root, the
# embedded PostgreSQL runs as the postgres user, who must be able to enter the directory.
data=$(mktemp -d /tmp/chime-clients.XXXXXX)
chmod 0755 "$data"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export CHIME_DATA_DIR="$data/data" CHIME_LISTEN="127.0.0.1:$port" CHIME_SHUTDOWN_GRACE_SECS=2
unset DATABASE_URL
"$chime" serve >"$data/chime.log" 2>&1 &
chime_pid=$!
stop_chime() {
    kill -TERM "$chime_pid" 2>/dev/null && wait "$chime_pid" 2>/dev/null || true
    rm -rf "$data"
}
trap stop_chime EXIT
ready() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "http://127.0.0.1:$port/readyz" 2>/dev/null; }
for _ in $(seq 1 240); do
    ready && break
    kill -0 "$chime_pid" 2>/dev/null || { echo "error: chime serve exited; its log:" >&2; cat "$data/chime.log" >&2; exit 1; }
    sleep 0.5
done
ready || { echo "error: chime not ready after 120 s; its log:" >&2; tail -50 "$data/chime.log" >&2; exit 1; }
# The admin command attaches to the running embedded database.
CHIME_TEST_ADMIN_TOKEN=$("$chime" admin-token create --name clients-test | tail -1)
export CHIME_TEST_URL="http://127.0.0.1:$port" CHIME_TEST_ADMIN_TOKEN
echo "chime serving on $CHIME_TEST_URL (log: $data/chime.log)"

# The TypeScript client's src/openapi.ts is generated from chime's OpenAPI document: made
# again here from this chime's, it must be the file checked in. To regenerate it:
#   chime openapi >/tmp/openapi.json && (cd clients/typescript && npm run generate -- /tmp/openapi.json -o src/openapi.ts)
types_match() {
    # (set -e does not hold inside `||`: each step says its own failure.)
    "$chime" openapi >"$data/openapi.json" || { echo "error: chime openapi failed" >&2; return 1; }
    npm run --silent generate -- "$data/openapi.json" -o "$data/openapi.ts" >"$data/generate.log" 2>&1 || {
        cat "$data/generate.log" >&2
        echo "error: openapi-typescript failed" >&2
        return 1
    }
    diff -u src/openapi.ts "$data/openapi.ts" || {
        echo "error: clients/typescript/src/openapi.ts differs from chime's OpenAPI document (above); regenerate it as clients/test.sh says" >&2
        return 1
    }
}

failed=()
for suite in "${suites[@]}"; do
    echo "=== $suite client"
    case $suite in
        python) (cd clients/python && "${PYTHON:-python3}" -m unittest discover -s tests -v) || failed+=(python) ;;
        php) php clients/php/tests/run.php || failed+=(php) ;;
        typescript) (cd clients/typescript && npm ci --no-audit --no-fund && types_match && npm run build && npm test) || failed+=(typescript) ;;
    esac
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "error: client suites failed: ${failed[*]}; chime's log follows" >&2
    tail -100 "$data/chime.log" >&2
    exit 1
fi
echo "client suites passed: ${suites[*]}"
