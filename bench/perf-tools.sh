# Sourced by bench/profile.sh, bench/layers.sh and bench/timeline.sh: finds the release
# binaries they drive and checks that perf is there. Sets `bench` (lock-bench) and `lockd`
# (LOCKD_BIN picks another lockd); exits 2 naming what is missing. Defines `workload_window`
# and `client_style`.
target=${CARGO_TARGET_DIR:-target}
bench="$target/release/lock-bench"
lockd=${LOCKD_BIN:-$target/release/lockd}
for bin in "$bench" "$lockd"; do
  [ -x "$bin" ] || { echo "missing $bin: cargo build --release -p lockd -p lock-bench" >&2; exit 2; }
done
command -v perf >/dev/null || { echo "perf not found (Debian: apt-get install linux-perf)" >&2; exit 2; }

# workload_window W: sets `secs` (lock-bench's window flags) and `lead` (seconds until perf may
# start) for a run in which workload W (w1, w2 or w3) runs 20 s and the others 1 s. lock-bench
# runs W3, then W2, then W1 (then W4); perf starts once the chosen one is about 5 s in (three
# nodes start in ~3 s, each 1 s workload adds ~2 s with its warm-up). Exits 2 on another name.
workload_window() {
  case "$1" in
    w3) secs=(--w3-secs 20 --w2-secs 1 --w1-secs 1); lead=9 ;;
    w2) secs=(--w3-secs 1 --w2-secs 20 --w1-secs 1); lead=11 ;;
    w1) secs=(--w3-secs 1 --w2-secs 1 --w1-secs 20); lead=13 ;;
    *) echo "workload must be w1, w2 or w3, not $1" >&2; exit 2 ;;
  esac
}

# client_style C: sets `key`, the key of lockd's results in lock-bench's results.json for client
# style C (unary or pipeline). Exits 2 on another name.
client_style() {
  case "$1" in
    unary) key=lockd_unary ;;
    pipeline) key=lockd ;;
    *) echo "client must be unary or pipeline, not $1" >&2; exit 2 ;;
  esac
}
