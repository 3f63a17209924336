#!/bin/bash
# Runs inside the container that deploy/debian/test.sh boots, as a unit under systemd:
# chime.service as an admin would use it. Writes /root/boot-test.ok when all passed.
set -euo pipefail
exec >/root/boot-test.log 2>&1
trap 'journalctl -u chime --no-pager | tail -40' EXIT
fail() { echo "FAIL: $*"; exit 1; }
api() { curl -fsS "http://127.0.0.1:8080$1" -H "Authorization: Bearer $token" "${@:2}"; }

# Installing does not enable it: chime.env needs editing first.
[ "$(systemctl is-enabled chime || true)" = disabled ] || fail "chime.service is enabled on install"

systemctl start chime
for _ in $(seq 60); do curl -fsS http://127.0.0.1:8080/readyz >/dev/null 2>&1 && break; sleep 1; done
curl -fsS http://127.0.0.1:8080/readyz || fail "/readyz not 200 within 60 s"
echo
echo "ok: chime.service ready"

# initdb and postgres ran as chime, inside the unit's limits.
pgrep -u chime -x postgres >/dev/null || fail "no postgres running as chime"
echo "ok: the embedded PostgreSQL runs as chime"

# A task through the built-in demo receiver, with the token the first start wrote.
token=$(grep -A1 'its API token:' /var/lib/chime/first-start-credentials.txt | tail -1)
task=$(api /api/v1/tasks -H 'Content-Type: application/json' \
    -d '{"biz_type": "demo", "delay_ms": 500, "payload": {"from": "boot-test"}}')
id=$(sed 's/^{"id":"\([^"]*\)".*/\1/' <<<"$task")
for _ in $(seq 20); do
    api "/api/v1/tasks/$id" | grep -q '"status":"succeeded"' && break
    sleep 0.5
done
api "/api/v1/tasks/$id" | grep -q '"status":"succeeded"' || fail "task $id not delivered"
echo "ok: a task delivered"

# Stop: well within TimeoutStopSec, cleanly, the embedded PostgreSQL stopped by chime.
t0=$(date +%s%N)
systemctl stop chime
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$(systemctl show -P Result chime)" = success ] || fail "stop: Result=$(systemctl show -P Result chime)"
if pgrep -u chime >/dev/null; then fail "processes of chime left: $(pgrep -u chime -a)"; fi
journalctl -u chime --no-pager | grep -q 'embedded PostgreSQL stopped' || fail "chime did not stop its PostgreSQL"
echo "ok: stopped cleanly in $ms ms"

touch /root/boot-test.ok
