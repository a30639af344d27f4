#!/usr/bin/env bash
# Where the lockd nodes' CPU goes, layer by layer (issue 23): runs one workload with one client
# style for 20 s against a lockd-only lock-bench, records 4 s of the three nodes with DWARF call
# graphs, and prints each layer's share of the samples and its microseconds per pair
# (bench/layers.py: lockd's own code, openraft, HTTP/2 and gRPC, TLS, tokio, the allocator, the
# kernel's socket work, wake-ups, the disk):
#   - layers.md: the table; perf.data and script.txt: the samples;
#   - bench/: lock-bench's own table for the run (its server CPU per pair scales the table).
#
# Usage: bench/layers.sh [w1|w2|w3] [unary|pipeline] [OUT_DIR] [DATA_ROOT]
#        (default: w1 unary bench-layers, the temp dir; DATA_ROOT /dev/shm takes the disk out)
# Needs: perf (Debian: linux-perf), python3, root or kernel.perf_event_paranoid <= 1, and a
# release build (cargo build --release -p lockd -p lock-bench; LOCKD_BIN picks another lockd).
# DWARF unwinding copies 16 KiB of stack per sample, which slows the run: read the shares, and
# take speed from runs without perf.
set -euo pipefail

workload=${1:-w1}
client=${2:-unary}
out=${3:-bench-layers}
data_root=${4:-${TMPDIR:-/tmp}}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/perf-tools.sh
. "$here/perf-tools.sh"
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 2; }

# The chosen workload runs 20 s, the others 1 s; `lead` is when perf may start.
workload_window "$workload"
client_style "$client"

mkdir -p "$out"
"$bench" --systems lockd --lockd-bin "$lockd" --client "$client" --data-root "$data_root" \
  "${secs[@]}" --w4-secs 1 --w4-sessions 10 --warmup-secs 1 \
  --out "$out/bench" > "$out/bench.log" 2>&1 &
bench_pid=$!
trap 'kill "$bench_pid" 2>/dev/null || true' EXIT

sleep "$lead"
pids=$(pgrep -d, -f "$lockd run" || true)
[ -n "$pids" ] || { echo "no lockd nodes found; see $out/bench.log" >&2; exit 1; }
perf record -p "$pids" --call-graph dwarf,16384 -F 199 -o "$out/perf.data" -- sleep 4 \
  2> "$out/perf-record.log"

wait "$bench_pid"
trap - EXIT
perf script -i "$out/perf.data" -F comm,pid,ip,sym > "$out/script.txt" 2>/dev/null
cpu=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]][sys.argv[3]]['server_cpu_ms_per_pair'])" \
  "$out/bench/results.json" "$key" "$workload")
python3 "$here/layers.py" "$out/script.txt" "$cpu" > "$out/layers.md"
cat "$out/layers.md"
echo "server CPU per pair in this (profiled) run: $cpu ms; layers of $workload ($client) in $out: layers.md, script.txt, bench/results.md"
