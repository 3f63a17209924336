#!/bin/sh
# The official image's first start, cut down: initdb with the user and password given, a
# database, password logins over TCP; then postgres in the foreground.
set -eu
if [ "$(id -u)" = 0 ]; then
    install -d -o postgres -g postgres -m 0700 "$PGDATA"
    install -d -o postgres -g postgres -m 2775 /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user=${POSTGRES_USER:-postgres}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    password=${POSTGRES_PASSWORD:-}
    [ -n "${POSTGRES_PASSWORD_FILE:-}" ] && password=$(cat "$POSTGRES_PASSWORD_FILE")
    [ -n "$password" ] || { echo "POSTGRES_PASSWORD is not set" >&2; exit 1; }
    printf '%s\n' "$password" >/tmp/pwfile
    initdb -D "$PGDATA" -U "$user" --pwfile=/tmp/pwfile --auth-local=trust --auth-host=scram-sha-256
    rm /tmp/pwfile
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
    db=${POSTGRES_DB:-$user}
    [ "$db" = postgres ] || createdb -U "$user" "$db"
    pg_ctl -D "$PGDATA" -m fast -w stop
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
