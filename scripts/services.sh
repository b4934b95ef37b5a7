#!/usr/bin/env bash
# Start the local services meshpoint's tests use, if they are down, and wait until
# they accept connections. Needs the Debian packages of PostgreSQL and nats-server
# and the right to start them (root on CI machines).
set -euo pipefail

PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
NATS_PORT=${NATS_PORT:-4222}

wait_for() {  # name, seconds, command...
  local name=$1 seconds=$2; shift 2
  for _ in $(seq "$seconds"); do
    if "$@" >/dev/null 2>&1; then echo "services: $name is up"; return 0; fi
    sleep 1
  done
  echo "services: $name did not come up within ${seconds}s" >&2
  return 1
}

pg_up() { pg_isready -h "$PG_HOST" -p "$PG_PORT" -q; }
nats_up() { (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null; }

if ! pg_up; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start || true
fi
wait_for PostgreSQL 60 pg_up

if ! nats_up; then
  if command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ]; then
    echo "services: starting NATS with JetStream"
    mkdir -p /var/lib/nats-server
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
      -a 127.0.0.1 -p "$NATS_PORT" -js -sd /var/lib/nats-server -l /var/log/nats-server.log
    wait_for NATS 30 nats_up
  else
    echo "services: nats-server is not installed; NATS tests will need it" >&2
  fi
fi

# Chromium for the dashboard's browser tests (Debian's: Playwright drives it, no
# `playwright install`). Installed in CI (CI=true) or when missing and we are root;
# on a laptop without root the browser tests skip saying so.
if ! [ -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "services: installing chromium"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium \
      || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
           --no-install-recommends chromium; } \
      || echo "services: chromium could not be installed; browser tests will need it" >&2
  elif [ "${CI:-}" = true ]; then
    echo "services: chromium is missing and this CI job is not root" >&2
    exit 1
  else
    echo "services: chromium is not installed (apt-get install chromium, as root); the" \
         "dashboard's browser tests will skip" >&2
  fi
fi
