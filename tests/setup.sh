#!/usr/bin/env bash
# Installs what building chime and running its test suite need, when missing (Debian or
# Ubuntu, with apt-get; as root, or through sudo). Quick when everything is there: it only
# looks. The README's two commands start with it, and .ci/run uses it too.
set -euo pipefail

# Each line: the Debian package, then the shell test that says it is there.
needs=(
    # The C linker and OpenSSL's development files: sqlx's TLS to PostgreSQL is OpenSSL's
    # (native-tls), as libpq's, and openssl-sys finds the system's libssl through pkg-config.
    "gcc|command -v cc"
    "pkg-config|command -v pkg-config"
    "libssl-dev|test -f /usr/include/openssl/ssl.h"
    # chime's embedded PostgreSQL and every test start one from the server binaries
    # (initdb, pg_ctl, postgres); the HA tests (tests/ha) run PostgreSQL 15 replicas and a
    # pg_auto_failover formation.
    "postgresql|compgen -G '/usr/lib/postgresql/*/bin/initdb'"
    "postgresql-15|test -x /usr/lib/postgresql/15/bin/pg_basebackup"
    "pg-auto-failover-cli|command -v pg_autoctl"
    "postgresql-15-auto-failover|test -f /usr/share/postgresql/15/extension/pgautofailover.control"
    # The https callback test runs `openssl s_server`; the console tests drive headless
    # Chromium through ChromeDriver (the paths tests/api/browser.rs expects); PgBouncer is for
    # pooler mode, HAProxy for the proxy in front of a primary and its standby.
    "openssl|command -v openssl"
    "chromium|test -x /usr/bin/chromium"
    "chromium-driver|test -x /usr/bin/chromedriver"
    "pgbouncer|command -v pgbouncer"
    "haproxy|test -x /usr/sbin/haproxy"
    # npm fetches axe-core, which the console's accessibility test runs in Chromium.
    "npm|command -v npm"
    # The Standard Webhooks test verifies with the specification's Python library, in a venv.
    "python3-venv|python3 -c 'import ensurepip'"
)
# More, from the caller (.ci/run's own tools), in the same form.
needs+=("$@")

missing=()
for need in "${needs[@]}"; do
    eval "${need#*|}" >/dev/null 2>&1 || missing+=("${need%%|*}")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}" >&2
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null; then
        as_root=(sudo)
    else
        echo "error: missing ${missing[*]}; install them as root (apt-get install ${missing[*]}) and run this again" >&2
        exit 1
    fi
    "${as_root[@]}" apt-get update
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
for need in "${needs[@]}"; do
    eval "${need#*|}" >/dev/null 2>&1 || { echo "error: ${need%%|*} still not found (${need#*|})" >&2; exit 1; }
done
pkg-config --exists openssl || { echo "error: OpenSSL's development files (libssl-dev) still not found by pkg-config" >&2; exit 1; }

root="$(cd "$(dirname "$0")/.." && pwd)"

# axe-core, pinned (tests/api/console_a11y.rs checks the version), kept out of the
# repository: under target/, which git ignores.
axe_version=4.14.1
if ! grep -qs "\"version\": \"$axe_version\"" "$root/target/axe/node_modules/axe-core/package.json"; then
    echo "installing axe-core $axe_version into target/axe" >&2
    npm install --no-save --no-audit --no-fund --prefix "$root/target/axe" "axe-core@$axe_version" >&2
fi

# The OpenID Provider the console's sign-in tests run (tests/oidc/provider.mjs, started by
# tests/api/oidc.rs): the OpenID Certified npm package oidc-provider, pinned, under target/
# as axe-core is. (It warns that it prefers Node.js 22; it runs on Debian's 20.)
oidc_provider_version=9.13.3
if ! grep -qs "\"version\": \"$oidc_provider_version\"" "$root/target/oidc-provider/node_modules/oidc-provider/package.json"; then
    echo "installing oidc-provider $oidc_provider_version into target/oidc-provider" >&2
    npm install --no-save --no-audit --no-fund --prefix "$root/target/oidc-provider" "oidc-provider@$oidc_provider_version" >&2
fi

# The Standard Webhooks specification's own libraries, pinned (tests/api/standard_webhooks.rs
# verifies real callbacks with them), under target/ as axe-core is: PyPI's in a venv, npm's
# beside it.
swh_version=1.1.0
swh_venv="$root/target/standard-webhooks-venv"
if [ "$("$swh_venv/bin/python" -c 'import importlib.metadata as m; print(m.version("standardwebhooks"))' 2>/dev/null)" != "$swh_version" ]; then
    echo "installing Python's standardwebhooks $swh_version into target/standard-webhooks-venv" >&2
    python3 -m venv --clear "$swh_venv"
    "$swh_venv/bin/pip" install --quiet --disable-pip-version-check "standardwebhooks==$swh_version" >&2
fi
# The OpenTelemetry project's protobuf definitions, pinned, for the OTLP receiver of
# tests/api/traces.rs (tests/otlp/receiver.py), in a venv of its own.
otlp_version=1.45.2
otlp_protobuf_version=7.36.2
otlp_venv="$root/target/otlp-venv"
if [ "$("$otlp_venv/bin/python" -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"), m.version("protobuf"))' 2>/dev/null)" != "$otlp_version $otlp_protobuf_version" ]; then
    echo "installing Python's opentelemetry-proto $otlp_version into target/otlp-venv" >&2
    python3 -m venv --clear "$otlp_venv"
    "$otlp_venv/bin/pip" install --quiet --disable-pip-version-check "opentelemetry-proto==$otlp_version" "protobuf==$otlp_protobuf_version" >&2
fi
swh_npm_version=1.1.1
if ! grep -qs "\"version\": \"$swh_npm_version\"" "$root/target/standard-webhooks/node_modules/standardwebhooks/package.json"; then
    echo "installing npm's standardwebhooks $swh_npm_version into target/standard-webhooks" >&2
    npm install --no-save --no-audit --no-fund --prefix "$root/target/standard-webhooks" "standardwebhooks@$swh_npm_version" >&2
fi
