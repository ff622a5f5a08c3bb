#!/usr/bin/env bash
# Boot the collector unit under a real systemd in a container and check what the
# unit promises: READY=1 (ActiveState=active for Type=notify), a STATUS= line,
# journald entries with structured fields, and a watchdog restart of a hung
# daemon (SIGSTOP: no more WATCHDOG=1, systemd kills it after WatchdogSec and
# Restart=on-failure brings it back).
#
# Not part of `make test` (it debootstraps a Debian image and installs the
# wheel's dependencies: minutes, and network access to the Debian mirror and
# PyPI). Run it as root from the repository root:
#
#   appliance/podman/boot-check.sh                 # podman, the default
#   ENGINE=nspawn appliance/podman/boot-check.sh   # systemd-nspawn instead
#
# Needs: debootstrap, python3 with pip, and podman (runc or crun) or
# systemd-nspawn (package systemd-container). Hosts whose root lacks
# CAP_SYS_RESOURCE (some CI sandboxes) cannot run podman: its OCI runtime fails
# with "setrlimit ... Operation not permitted"; use ENGINE=nspawn there.
# The base image is built from debootstrap and imported; no registry is used.
# Only the collector is booted: verifierd needs vLLM and a GPU.
set -euo pipefail

ENGINE=${ENGINE:-podman}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
CACHE=${CACHE:-/var/tmp/veritap-boot-check}
IMAGE=localhost/veritap-boot-check:$SUITE
NAME=veritap-boot-check-$$
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "$CACHE.work.XXXXXX")
WATCHDOG_WAIT_S=${WATCHDOG_WAIT_S:-120}
LEADER=

say() { printf '== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

cleanup() {
  case $ENGINE in
    podman) podman rm -f "$NAME" >/dev/null 2>&1 || true ;;
    nspawn) [ -n "$LEADER" ] && kill -TERM "$LEADER" 2>/dev/null || true ;;
  esac
  rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || fail "run as root"
command -v debootstrap >/dev/null || fail "needs debootstrap"

# 1. A Debian root with systemd, built once and cached.
ROOTFS=$CACHE/rootfs-$SUITE
if [ ! -x "$ROOTFS/usr/lib/systemd/systemd" ]; then
  say "debootstrap $SUITE into $ROOTFS"
  rm -rf "$ROOTFS"
  mkdir -p "$CACHE"
  debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,python3,python3-venv,iproute2,ethtool,tcpdump \
    "$SUITE" "$ROOTFS" "$MIRROR" >"$CACHE/debootstrap.log"
fi

# 2. The veritap wheel and every dependency it needs, as wheels the container
#    installs offline (the "systemd" extra is left out: the datagram senders of
#    appliance.sd_notify and appliance.journal are what runs then).
say "building the wheelhouse"
"${PYTHON:-python3}" -m pip wheel -q -w "$WORK/wheelhouse" "$REPO" 2>"$CACHE/pip-wheel.log" \
  || fail "pip wheel failed (see $CACHE/pip-wheel.log)"
cp -r "$REPO/appliance" "$WORK/appliance"
cat >"$WORK/setup.sh" <<'SETUP'
#!/bin/sh
set -eu
python3 -m venv /opt/veritap/venv
/opt/veritap/venv/bin/pip install -q --no-index --find-links /work/wheelhouse veritap
mkdir -p /etc/sysusers.d /etc/veritap/keys
cp /work/appliance/sysusers.d/veritap-collector.conf /etc/sysusers.d/
systemd-sysusers /etc/sysusers.d/veritap-collector.conf
/opt/veritap/venv/bin/collector keygen --name boot-check.example/tap --out /etc/veritap/keys/collector.key
chgrp veritap-collector /etc/veritap/keys/collector.key
chmod 0640 /etc/veritap/keys/collector.key
cat >/etc/veritap/collector.toml <<'TOML'
[collector]
origin = "boot-check.example/tap"
[capture]
interface = "lo"
checksums = "ignore"
filter = "tcp port 8000"
[log]
path = "/var/lib/veritap/collector/log"
key = "/etc/veritap/keys/collector.key"
[ledger]
listen = "127.0.0.1:7700"
TOML
cp /work/appliance/systemd/veritap-collector.service /etc/systemd/system/
systemctl daemon-reload
SETUP
chmod +x "$WORK/setup.sh"

# 3. Boot the container.
case $ENGINE in
  podman)
    command -v podman >/dev/null || fail "needs podman (or ENGINE=nspawn)"
    if ! podman image exists "$IMAGE"; then
      say "importing $ROOTFS as $IMAGE"
      tar -C "$ROOTFS" -c . | podman import --change 'CMD ["/sbin/init"]' - "$IMAGE" >/dev/null
    fi
    podman run -d --name "$NAME" --privileged --systemd=always \
      -v "$WORK:/work:ro" "$IMAGE" /sbin/init >/dev/null
    inside() { podman exec "$NAME" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
    ;;
  nspawn)
    command -v systemd-nspawn >/dev/null || fail "needs systemd-nspawn (systemd-container)"
    systemd-nspawn --register=no --keep-unit --quiet --volatile=overlay --private-network \
      --capability=all --bind-ro="$WORK:/work" -D "$ROOTFS" --boot \
      </dev/null >"$CACHE/nspawn-console.log" 2>&1 &
    NSPAWN=$!
    for _ in $(seq 100); do
      LEADER=$(pgrep -P "$NSPAWN" | head -n1 || true)
      [ -n "$LEADER" ] && break
      sleep 0.2
    done
    [ -n "$LEADER" ] || fail "systemd-nspawn did not start (see $CACHE/nspawn-console.log)"
    inside() {
      nsenter --target "$LEADER" --mount --uts --ipc --net --pid --root \
        -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -c 'cd / && exec "$@"' sh "$@"
    }
    ;;
  *) fail "ENGINE must be podman or nspawn" ;;
esac

say "waiting for systemd in the container"
for _ in $(seq 120); do
  state=$(inside systemctl is-system-running 2>/dev/null || true)
  case $state in running | degraded) break ;; esac
  sleep 1
done
case $state in running | degraded) ;; *) fail "container systemd state: ${state:-none}" ;; esac

say "installing the collector into the container"
inside /work/setup.sh

show() { inside systemctl show -P "$1" veritap-collector.service; }

# 4. READY and STATUS.
say "starting veritap-collector.service"
inside systemctl start veritap-collector.service || {
  inside journalctl -u veritap-collector.service --no-pager | tail -n 30
  fail "start failed"
}
[ "$(show ActiveState)" = active ] || fail "not active after start (no READY=1?)"
status=$(show StatusText)
[ -n "$status" ] || fail "no STATUS= text"
say "READY ok; STATUS: $status"

# 5. journald got the daemon's entries; report whether they carry structured fields.
inside journalctl -u veritap-collector.service -o json --no-pager >"$WORK/journal.json"
[ -s "$WORK/journal.json" ] || fail "no journal entries from the collector"
if grep -q '"LOGGER"' "$WORK/journal.json"; then
  say "journal: structured entries (LOGGER, CODE_*, extra= fields) present"
else
  say "journal: entries present, none structured (the daemon did not call appliance.journal.setup_logging)"
fi

# 6. The pings keep a live daemon running past WatchdogSec ...
pid=$(show MainPID)
restarts=$(show NRestarts)
watchdog_us=$(inside systemd-analyze timespan "$(show WatchdogUSec)" | sed -n 's/^ *μs: *//p')
watchdog_s=$((watchdog_us / 1000000))
[ "$watchdog_s" -gt 0 ] || fail "the unit has no WatchdogSec"
say "waiting $((watchdog_s + 10))s: longer than WatchdogSec=${watchdog_s}s"
sleep $((watchdog_s + 10))
[ "$(show MainPID)" = "$pid" ] && [ "$(show NRestarts)" = "$restarts" ] \
  || fail "restarted although alive: the main loop does not send WATCHDOG=1"
say "still PID $pid after ${watchdog_s}s: WATCHDOG=1 pings arrive"

# ... and a hung one is killed and restarted.
say "freezing the main process $pid (SIGSTOP)"
inside systemctl kill --kill-whom=main --signal=SIGSTOP veritap-collector.service
deadline=$((SECONDS + WATCHDOG_WAIT_S))
until [ "$(show NRestarts)" -gt "$restarts" ] && [ "$(show ActiveState)" = active ]; do
  [ $SECONDS -lt $deadline ] || fail "no watchdog restart within ${WATCHDOG_WAIT_S}s"
  sleep 2
done
newpid=$(show MainPID)
[ "$newpid" != "$pid" ] || fail "same main PID after the restart"
inside journalctl -u veritap-collector.service --no-pager | grep -q "Watchdog timeout" \
  || fail "restarted, but the journal names no watchdog timeout"
say "watchdog restart ok: PID $pid -> $newpid, NRestarts $(show NRestarts)"
say "boot check passed ($ENGINE)"
