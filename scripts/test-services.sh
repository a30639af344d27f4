#!/usr/bin/env bash
# Private backends for the conformance suite (issue 8): one PostgreSQL and a three-member etcd
# cluster on free 127.0.0.1 ports, with their data in a temporary folder.
#
#   eval "$(scripts/test-services.sh start)"   # prints `export LOCKD_TEST_PG_URL=...` etc.
#   scripts/test-services.sh stop "$LOCKD_TEST_SERVICES_DIR"
#   scripts/test-services.sh install           # apt-get the Debian packages if missing (root)
#
# Everything this starts is recorded under the folder and stopped by `stop`; nothing else is
# touched. Progress goes to stderr, the exports to stdout.
set -euo pipefail

PG_BIN="${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
ETCD_BIN="${ETCD_BIN:-/usr/bin/etcd}"
# How long each service gets to come up (seconds).
READY_WAIT_S=60
ETCD_MEMBERS=3

log() { printf 'test-services: %s\n' "$*" >&2; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

install() {
  local need=()
  [ -x "${PG_BIN:-/nonexistent}/postgres" ] || need+=(postgresql)
  [ -x "$ETCD_BIN" ] || need+=(etcd-server)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

start_pg() {
  local dir=$1 port
  port=$(free_port)
  mkdir -p "$dir/pg" "$dir/pg-sock"
  local as=()
  if [ "$(id -u)" = 0 ]; then
    # PostgreSQL refuses to run as root.
    chown -R postgres:postgres "$dir/pg" "$dir/pg-sock"
    chmod 755 "$dir"
    as=(runuser -u postgres --)
  fi
  "${as[@]}" "$PG_BIN/initdb" -D "$dir/pg" -A trust -U postgres --no-sync >"$dir/pg-initdb.log" 2>&1 \
    || { cat "$dir/pg-initdb.log" >&2; return 1; }
  touch "$dir/pg.log" && { [ "$(id -u)" != 0 ] || chown postgres:postgres "$dir/pg.log"; }
  "${as[@]}" "$PG_BIN/pg_ctl" -D "$dir/pg" -l "$dir/pg.log" -w -t "$READY_WAIT_S" \
    -o "-p $port -k $dir/pg-sock -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
    start >&2 || { cat "$dir/pg.log" >&2; return 1; }
  echo "postgres://postgres@127.0.0.1:$port/postgres" >"$dir/pg.url"
  log "postgres ready on 127.0.0.1:$port"
}

start_etcd() {
  local dir=$1 i cluster="" clients=()
  local -a cports pports
  for i in $(seq 1 $ETCD_MEMBERS); do
    cports[i]=$(free_port)
    pports[i]=$(free_port)
    cluster+="${cluster:+,}e$i=http://127.0.0.1:${pports[i]}"
  done
  for i in $(seq 1 $ETCD_MEMBERS); do
    mkdir -p "$dir/etcd-$i"
    "$ETCD_BIN" --name "e$i" --data-dir "$dir/etcd-$i/data" \
      --listen-client-urls "http://127.0.0.1:${cports[i]}" \
      --advertise-client-urls "http://127.0.0.1:${cports[i]}" \
      --listen-peer-urls "http://127.0.0.1:${pports[i]}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${pports[i]}" \
      --initial-cluster "$cluster" --initial-cluster-state new \
      --initial-cluster-token "lockd-test-$$" >"$dir/etcd-$i/log" 2>&1 &
    echo $! >"$dir/etcd-$i/pid"
    clients+=("http://127.0.0.1:${cports[i]}")
  done
  local deadline=$((SECONDS + READY_WAIT_S))
  for url in "${clients[@]}"; do
    until curl -fsS "$url/health" 2>/dev/null | grep -q '"health":"true"'; do
      if [ $SECONDS -ge $deadline ]; then
        log "etcd member $url not healthy within ${READY_WAIT_S}s"
        tail -n 20 "$dir"/etcd-*/log >&2
        return 1
      fi
      sleep 0.2
    done
  done
  (IFS=,; echo "${clients[*]}") >"$dir/etcd.endpoints"
  log "etcd ready: $(cat "$dir/etcd.endpoints")"
}

stop() {
  local dir=${1:?usage: stop DIR}
  [ -d "$dir" ] || return 0
  if [ -f "$dir/pg/postmaster.pid" ]; then
    local as=()
    [ "$(id -u)" != 0 ] || as=(runuser -u postgres --)
    "${as[@]}" "$PG_BIN/pg_ctl" -D "$dir/pg" -m immediate -w stop >&2 || true
  fi
  for pidfile in "$dir"/etcd-*/pid; do
    [ -f "$pidfile" ] || continue
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    local n=0
    while kill -0 "$pid" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
  log "stopped and removed $dir"
}

case "${1:-}" in
  install) install ;;
  start)
    dir=$(mktemp -d /tmp/lockd-test-services.XXXXXX)
    if ! { start_pg "$dir" && start_etcd "$dir"; }; then
      stop "$dir"
      exit 1
    fi
    echo "export LOCKD_TEST_SERVICES_DIR=$dir"
    echo "export LOCKD_TEST_PG_URL=$(cat "$dir/pg.url")"
    echo "export LOCKD_TEST_ETCD_ENDPOINTS=$(cat "$dir/etcd.endpoints")"
    ;;
  stop) stop "${2:-${LOCKD_TEST_SERVICES_DIR:-}}" ;;
  *) echo "usage: $0 install | start | stop DIR" >&2; exit 2 ;;
esac
