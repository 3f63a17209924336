#!/usr/bin/env bash
# Tests the Containerfile and compose.yaml with podman, as root, on Debian bookworm.
#
# 1. The image: runs with its embedded PostgreSQL on a named volume; a task created through
#    the API reaches a receiver on the host; after a restart the biz type, the token and the
#    task are still there, and a task due during the restart is delivered.
# 2. compose.yaml: PostgreSQL and two chime nodes; a task goes through, one node is stopped,
#    and a task made through the other is delivered.
#
# No registry can be reached here, so the images compose.yaml and the Containerfile name
# are made locally, under those names:
# - docker.io/library/debian:bookworm-slim: mmdebstrap (minbase) of this machine's Debian.
#   Kept between runs: making it takes about a minute.
# - The Containerfile's build stage (FROM rust) is not built. `--build-context build=DIR`
#   replaces it with DIR/out/chime, the chime built on this machine (CHIME_BIN, else
#   target/debug/chime as CI builds it; a debug binary is slower but tests the same
#   image). Same Debian release on both sides, so the same libc and libssl.
# - docker.io/library/postgres:15: a stand-in made from the chime image, which has
#   PostgreSQL 15's binaries, with an entrypoint that does what the official image's does
#   for the settings compose.yaml uses (deploy/container/postgres-standin/).
# Everything else this script makes is removed at exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS
tag=chime-image-test-$$
target_dir=${CARGO_TARGET_DIR:-target}
work=$(mktemp -d /tmp/chime-container-test.XXXXXX)

log() { printf '[container test %3ds] %s\n' $((SECONDS - start)) "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- What podman needs here -------------------------------------------------------------
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v podman-compose >/dev/null || missing+=(podman-compose)
# compose.yaml's services reach each other by name (chime's DATABASE_URL names `postgres`):
# on podman's CNI networks that takes the dnsname plugin, which Debian's podman only suggests.
[ -x /usr/lib/cni/dnsname ] || missing+=(golang-github-containernetworking-plugin-dnsname)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
for c in podman runc mmdebstrap podman-compose curl python3 objcopy; do
    command -v $c >/dev/null || die "$c still not found"
done
# This machine's kernel and cgroups: podman's default ulimits and the systemd cgroup
# manager both fail here. Written when there is no containers.conf; an existing one must
# already say so.
conf=/etc/containers/containers.conf
if [ ! -e $conf ]; then
    printf '[containers]\ndefault_ulimits = []\n\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' >$conf
fi
grep -q '^default_ulimits = \[\]' $conf && grep -q '^cgroup_manager = "cgroupfs"' $conf \
    || die "$conf must set [containers] default_ulimits = [] and [engine] cgroup_manager = \"cgroupfs\""
. /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] \
    || die "this test runs on Debian bookworm: the image is bookworm, and its chime is the one built here"

# --- Clean-up ------------------------------------------------------------------------------
receiver_pid=
# `down -v` removes the named volume, not the nodes' anonymous ones (/var/lib/chime; the
# stand-in inherits it): `rm -v` first.
compose_down() {
    [ -f $work/compose.yaml ] || return 0
    podman rm -f -v -t 0 ${tag}_chime1_1 ${tag}_chime2_1 ${tag}_postgres_1 >/dev/null 2>&1 || true
    (cd $work && podman-compose -p $tag down -v >/dev/null 2>&1) || true
    # podman-compose 1.0.3 leaves its network behind.
    podman network rm -f ${tag}_default >/dev/null 2>&1 || true
}
cleanup() {
    local rc=$?
    [ -n "$receiver_pid" ] && kill "$receiver_pid" 2>/dev/null || true
    if [ $rc -ne 0 ]; then
        log "failed; the last logs:"
        podman logs --tail 30 $tag 2>&1 | sed 's/^/  chime: /' >&2 || true
        [ -f $work/compose.yaml ] && (cd $work && podman-compose -p $tag logs 2>&1 | tail -40 | sed 's/^/  compose: /' >&2) || true
    fi
    podman rm -f -t 0 $tag >/dev/null 2>&1 || true
    podman volume rm -f $tag >/dev/null 2>&1 || true
    compose_down
    podman rmi -f chime:0.1.0 localhost/chime:0.1.0 docker.io/library/postgres:15 >/dev/null 2>&1 || true
    rm -rf "$work"
    exit $rc
}
trap cleanup EXIT

# --- Base image ---------------------------------------------------------------------------
# The path excludes are debian:*-slim's. The result is larger than the real one (127 MB
# against about 75) mostly by perl, which the image's PostgreSQL packages need anyway, so
# the size reported below should be near the real image's.
if ! podman image exists docker.io/library/debian:bookworm-slim; then
    log "making docker.io/library/debian:bookworm-slim with mmdebstrap"
    mmdebstrap --quiet --variant=minbase --aptopt='APT::Install-Recommends "false"' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/groff/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm - | podman import --change 'CMD ["bash"]' - docker.io/library/debian:bookworm-slim >/dev/null
fi

# --- The image ----------------------------------------------------------------------------
bin=${CHIME_BIN:-}
if [ -z "$bin" ]; then
    bin=$target_dir/debug/chime
    cargo build --quiet --bin chime
fi
[ -x "$bin" ] || die "no chime binary at $bin"
mkdir -p $work/build/out
# As the Containerfile's build stage does: without debug info.
objcopy --strip-debug "$bin" $work/build/out/chime
log "building the image's runtime stage around $bin"
# --format docker: podman's default (OCI) drops the HEALTHCHECK.
podman build --quiet --format docker --target runtime --build-context build=$work/build \
    -t chime:0.1.0 . >/dev/null
size=$(podman image inspect chime:0.1.0 --format '{{.Size}}')
log "image chime:0.1.0: $((size / 1000000)) MB (chime itself: $(($(stat -c %s $work/build/out/chime) / 1000000)) MB)"

# --- A receiver on the host ----------------------------------------------------------------
# Appends each callback's body as one line to $work/callbacks. Containers reach it as
# host.containers.internal, which podman puts in their /etc/hosts.
cat >$work/receiver.py <<'EOF'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(sys.argv[2], "ab") as f:
            f.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("0.0.0.0", 0), H)
open(sys.argv[1], "w").write(str(s.server_address[1]))
s.serve_forever()
EOF
python3 $work/receiver.py $work/receiver.port $work/callbacks &
receiver_pid=$!
for _ in $(seq 50); do [ -s $work/receiver.port ] && break; sleep 0.1; done
rport=$(cat $work/receiver.port)
hook=http://host.containers.internal:$rport/hook
touch $work/callbacks

# podman without systemd: healthcheck timers cannot be made, and it says so at every
# run, start, stop and rm. `podman healthcheck run` below runs the checks instead.
quiet_podman() { podman "$@" 2> >(grep -v 'systemd connection' >&2); }

# Waits until a callback whose body holds $1 arrives, up to $2 seconds.
wait_callback() {
    for _ in $(seq $(($2 * 5))); do grep -q "$1" $work/callbacks && return 0; sleep 0.2; done
    die "no callback with $1 within $2 s"
}
# Creates a task through the API at $1 with token $2, biz type $3, marker $4, delay $5 ms.
create_task() {
    curl -fsS "$1/api/v1/tasks" -H "Authorization: Bearer $2" \
        -d "{\"biz_type\": \"$3\", \"key\": \"$4\", \"delay_ms\": $5, \"payload\": {\"marker\": \"$4\"}}"
}
# Waits until the container's own HEALTHCHECK passes, up to $2 seconds.
wait_healthy() {
    for _ in $(seq $(($2 * 2))); do podman healthcheck run "$1" >/dev/null 2>&1 && return 0; sleep 0.5; done
    die "$1 not healthy within $2 s"
}

# --- 1. The image alone, embedded PostgreSQL ------------------------------------------------
log "image: running with the embedded PostgreSQL on volume $tag"
run_node() {
    # The host's port picked by podman (127.0.0.1::8080), so as not to clash with anything here.
    quiet_podman run -d --runtime runc --name $tag -v $tag:/var/lib/chime -p 127.0.0.1::8080 chime:0.1.0 >/dev/null
}
run_node
wait_healthy $tag 60
url=http://$(podman port $tag 8080/tcp)
podman exec $tag test -s /var/lib/chime/first-start-credentials.txt \
    || die "no first-start-credentials.txt in the volume"
secret=$(podman exec $tag chime biz-type create image_test --callback-url $hook 2>/dev/null | tail -1)
[ -n "$secret" ] || die "chime biz-type create printed no secret"
token=$(podman exec $tag chime token create --biz-type image_test 2>/dev/null | tail -1)
task=$(create_task $url "$token" image_test before-restart 0)
id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <<<"$task")
wait_callback before-restart 20
log "image: task $id delivered to the host"
# Due while the container is down: delivered once it is back.
create_task $url "$token" image_test during-restart 3000 >/dev/null
quiet_podman stop -t 30 $tag >/dev/null
grep -q during-restart $work/callbacks && die "the task due during the restart came before it"
sleep 3
quiet_podman start $tag >/dev/null
wait_healthy $tag 60
url=http://$(podman port $tag 8080/tcp)
curl -fsS "$url/api/v1/tasks/$id" -H "Authorization: Bearer $token" | grep -q '"succeeded"' \
    || die "task $id not found, or not succeeded, after the restart"
podman exec $tag chime biz-type list 2>/dev/null | grep -qw image_test || die "biz type image_test gone after the restart"
wait_callback during-restart 20
log "image: after the restart the biz type, token and task are there, and the due task was delivered"
quiet_podman rm -f -t 0 $tag >/dev/null
podman volume rm $tag >/dev/null

# --- 2. compose.yaml ---------------------------------------------------------------------
log "compose: building the postgres:15 stand-in"
podman build --quiet --format docker -t docker.io/library/postgres:15 deploy/container/postgres-standin >/dev/null
# compose.yaml as it is, beside a secret key of its own; host ports that are free here.
cp compose.yaml $work/
head -c 32 /dev/urandom | base64 >$work/chime-secret-key
chmod 644 $work/chime-secret-key   # read by uid 65532 in the containers
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
export CHIME1_PORT=$(free_port) CHIME2_PORT=$(free_port)
compose() { (cd $work && podman-compose -p $tag "$@"); }
compose up -d >$work/compose-up.log 2>&1 || { cat $work/compose-up.log >&2; die "podman-compose up failed"; }
node1=${tag}_chime1_1 node2=${tag}_chime2_1
# podman-compose 1.0.3 starts the nodes without waiting for `service_healthy`: they may come
# up while PostgreSQL is still in its first start (a server for initdb, stopped, then the
# real one), and lose it for a moment. Wait for the database too, and give the first admin
# command a few tries (a clean-clone CI run once failed here, silently, under set -e).
wait_healthy ${tag}_postgres_1 90
wait_healthy $node1 90
wait_healthy $node2 90
secret=
for _ in $(seq 30); do
    secret=$(podman exec $node1 chime biz-type create image_test --callback-url $hook 2>$work/create.err | tail -1) && break
    secret=
    sleep 1
done
[ -n "$secret" ] || die "chime biz-type create printed no secret (compose): $(cat $work/create.err)"
token=$(podman exec $node1 chime token create --biz-type image_test 2>/dev/null | tail -1)
create_task http://127.0.0.1:$CHIME1_PORT "$token" image_test compose-both 0 >/dev/null
wait_callback compose-both 20
log "compose: a task through chime1 delivered; stopping chime1"
quiet_podman stop -t 30 $node1 >/dev/null
create_task http://127.0.0.1:$CHIME2_PORT "$token" image_test compose-one 0 >/dev/null
wait_callback compose-one 30
log "compose: with chime1 stopped, a task through chime2 delivered"
compose_down
log "passed in $((SECONDS - start)) s"
