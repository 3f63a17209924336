#!/usr/bin/env bash
# Builds the Debian package and tries it in a clean Debian root (mmdebstrap): dpkg -i,
# chime --version, the user and the files, systemd-analyze verify on the unit as
# installed; then boots the root under systemd (systemd-nspawn), where chime.service
# starts with the embedded PostgreSQL, delivers a task and stops cleanly; then dpkg -r
# and dpkg -P: the data in /var/lib/chime must survive both, chime.env removal only.
# Needs root and the Debian mirror. About a minute, plus building cargo-deb once.
set -euo pipefail
cd "$(dirname "$0")/../.."

[ "$(id -u)" = 0 ] || { echo "error: $0 needs root (mmdebstrap, chroot, systemd-nspawn)" >&2; exit 1; }
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")

missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
command -v mmdebstrap >/dev/null || { echo "error: mmdebstrap still not found" >&2; exit 1; }
command -v systemd-nspawn >/dev/null || { echo "error: systemd-nspawn still not found (systemd-container)" >&2; exit 1; }

# cargo-deb, pinned and kept in the target dir: 3.x warns that --profile dev (below)
# will become an error, so a newer one must not arrive unseen. About 3 minutes to build.
cargo_deb="$target/tools/bin/cargo-deb"
if ! "$cargo_deb" --version 2>/dev/null | grep -qx 'cargo-deb 3.8.0'; then
    cargo install --quiet --locked cargo-deb --version 3.8.0 --root "$target/tools"
fi

# The dev profile: CI has built it for the tests already, where the release profile
# would cost a cold release build (about 6 minutes). `cargo deb` alone makes the
# release package users install; this checks the packaging, not the optimiser.
# --no-dbgsym: with it, cargo-deb would turn on debug info and rebuild everything.
# --fast: this package is thrown away.
rm -rf "$target/debian-test"
"$cargo_deb" deb --profile dev --no-dbgsym --fast --output "$target/debian-test/"
deb=$(echo "$target"/debian-test/chime_*.deb)
[ -f "$deb" ] || { echo "error: no package in $target/debian-test" >&2; exit 1; }
echo "package: $deb ($(du -k "$deb" | cut -f1) KiB)"

root=$(mktemp -d "$target/debian-test/root.XXXXXX")
trap 'rm -rf --one-file-system "$root"' EXIT
in_root() { chroot "$root" "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# A minimal root of this machine's release with the package's dependencies (version
# constraints dropped: dpkg -i checks them), its recommended postgresql, and systemd
# to boot it. No cache: mmdebstrap downloads into the root, which goes at the end.
. /etc/os-release
depends=$(dpkg-deb --field "$deb" Depends | tr ',' '\n' | sed 's/[(|].*//; s/ //g' | paste -sd,)
mirror=/etc/apt/sources.list.d/debian.sources
[ -f "$mirror" ] || mirror=http://deb.debian.org/debian
mmdebstrap --quiet --variant=essential --include="$depends,postgresql,systemd,systemd-sysv,curl,procps" \
    "$VERSION_CODENAME" "$root" "$mirror" </dev/null

cp "$deb" "$root/tmp/chime.deb"
in_root dpkg -i /tmp/chime.deb
in_root chime --version | grep -q '^chime ' || fail "chime --version"

# The unit as installed, with its binary and user present. verify exits 0 on what it
# ignores (an unknown key, a bad value), so any output fails.
verify=$(in_root systemd-analyze verify chime.service 2>&1) || fail "systemd-analyze verify: $verify"
[ -z "$verify" ] || fail "systemd-analyze verify: $verify"
in_root systemd-analyze security --offline=yes chime.service | tail -1

# TimeoutStopSec is chime's default grace plus 10 s, and chime.env names that default.
grace=$(in_root chime serve --help | sed -n '/--shutdown-grace-secs/,/\[default:/s/.*\[default: \([0-9]*\)\].*/\1/p')
[ -n "$grace" ] || fail "no default for --shutdown-grace-secs in chime serve --help"
grep -qx "TimeoutStopSec=$((grace + 10))s" "$root/usr/lib/systemd/system/chime.service" \
    || fail "TimeoutStopSec in chime.service is not the grace ($grace s) + 10 s"
grep -qx "#CHIME_SHUTDOWN_GRACE_SECS=$grace" "$root/etc/chime/chime.env" \
    || fail "chime.env does not show the grace's default ($grace)"

# A system user and group, no login.
entry=$(in_root getent passwd chime) || fail "no user chime"
IFS=: read -r _ _ uid _ _ home shell <<<"$entry"
[ "$uid" -lt 1000 ] || fail "chime is not a system user (uid $uid)"
[ "$home" = /var/lib/chime ] || fail "chime's home is $home"
[ "$shell" = /usr/sbin/nologin ] || fail "chime's shell is $shell"
in_root getent group chime >/dev/null || fail "no group chime"

for f in /usr/bin/chime /usr/lib/systemd/system/chime.service /etc/chime/chime.env \
    /usr/share/doc/chime/README.Debian; do
    [ -f "$root$f" ] || fail "$f missing"
done
[ "$(stat -c '%a %u' "$root/etc/chime/chime.env")" = "600 0" ] || fail "chime.env is not 600 root"
in_root dpkg-query -W -f='${Conffiles}\n' chime | grep -q '^ /etc/chime/chime.env ' \
    || fail "chime.env is not a conffile"
[ ! -e "$root/usr/bin/chime-bench" ] || fail "chime-bench is packaged"

# Boot it: deploy/debian/boot-test.sh runs as a unit, then powers the container off.
# Its own network, so that its port 8080 is not this machine's.
in_root systemd-machine-id-setup >/dev/null 2>&1
install -m 755 deploy/debian/boot-test.sh "$root/root/boot-test.sh"
cat > "$root/etc/systemd/system/boot-test.service" <<'EOF'
[Unit]
After=multi-user.target
SuccessAction=poweroff
FailureAction=poweroff
[Service]
Type=oneshot
ExecStart=/root/boot-test.sh
EOF
ln -s /etc/systemd/system/boot-test.service "$root/etc/systemd/system/multi-user.target.wants/"
started=$(date +%s)
timeout 300 systemd-nspawn --quiet --register=no --keep-unit --private-network \
    --directory="$root" --boot </dev/null >"$target/debian-test/boot.log" 2>&1 || true
if [ ! -f "$root/root/boot-test.ok" ]; then
    cat "$root/root/boot-test.log" 2>/dev/null || tail -40 "$target/debian-test/boot.log"
    fail "chime.service under systemd (boot-test.sh above; console in $target/debian-test/boot.log)"
fi
grep '^ok:' "$root/root/boot-test.log"
echo "booted, tested and powered off in $(( $(date +%s) - started )) s"
# (uids: names here would be this machine's, not the root's)
[ "$(stat -c '%a %u' "$root/var/lib/chime")" = "750 $uid" ] || fail "/var/lib/chime is not 750 chime"
[ -f "$root/var/lib/chime/pgdata/PG_VERSION" ] || fail "no embedded cluster in /var/lib/chime"

# An admin's edit of the settings.
echo "CHIME_LISTEN=0.0.0.0:8080" >> "$root/etc/chime/chime.env"

# Remove: program and unit go; settings, data and user stay.
in_root dpkg -r chime
[ ! -e "$root/usr/bin/chime" ] || fail "/usr/bin/chime left after dpkg -r"
[ ! -e "$root/usr/lib/systemd/system/chime.service" ] || fail "the unit left after dpkg -r"
grep -qx 'CHIME_LISTEN=0.0.0.0:8080' "$root/etc/chime/chime.env" || fail "dpkg -r lost chime.env"
[ -f "$root/var/lib/chime/pgdata/PG_VERSION" ] || fail "dpkg -r lost /var/lib/chime"
in_root getent passwd chime >/dev/null || fail "dpkg -r removed the user"

# Purge: settings go; data and user still stay.
in_root dpkg -P chime
[ ! -e "$root/etc/chime" ] || fail "/etc/chime left after dpkg -P"
[ -f "$root/var/lib/chime/pgdata/PG_VERSION" ] || fail "dpkg -P lost /var/lib/chime"
in_root getent passwd chime >/dev/null || fail "dpkg -P removed the user"

# Installed again, it finds the same user, so the kept data is still its own.
in_root dpkg -i /tmp/chime.deb
[ "$(in_root id -u chime)" = "$uid" ] || fail "reinstalled with another uid"
[ -f "$root/etc/chime/chime.env" ] || fail "no chime.env after reinstalling"

echo "Debian package: ok"
