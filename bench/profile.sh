#!/usr/bin/env bash
# Profiles the three lockd nodes while lock-bench drives one workload (issue 7):
#   - perf.data + report.txt: where the cluster's CPU goes (perf record, all CPUs, with stacks);
#   - flamegraph.svg: the same samples as a flame graph, one tower per process (needs inferno:
#     cargo install inferno; skipped with a note without it);
#   - syscalls.txt: every node thread's system calls, counted (perf trace -s);
#   - bench/: lock-bench's own table for the run.
#
# Usage: bench/profile.sh [w1|w2|w3] [OUT_DIR]      (default: w1, bench-profile)
# Needs: perf (Debian: linux-perf), root or kernel.perf_event_paranoid <= 1, and a release build
# (cargo build --release -p lockd -p lock-bench; LOCKD_BIN picks another lockd). The workload
# runs 20 s; perf samples 8 s of it, then traces system calls for 3 s. perf trace slows every
# call it sees, so syscalls.txt counts calls; its times are inflated.
set -euo pipefail

workload=${1:-w1}
out=${2:-bench-profile}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/perf-tools.sh
. "$here/perf-tools.sh"

# The chosen workload runs 20 s, the others 1 s; `lead` is when perf may start.
workload_window "$workload"

mkdir -p "$out"
"$bench" --systems lockd --lockd-bin "$lockd" "${secs[@]}" --w4-secs 1 --w4-sessions 10 \
  --warmup-secs 1 --out "$out/bench" > "$out/bench.log" 2>&1 &
bench_pid=$!
trap 'kill "$bench_pid" 2>/dev/null || true' EXIT

sleep "$lead"
pids=$(pgrep -d, -f "$lockd run" || true)
[ -n "$pids" ] || { echo "no lockd nodes found; see $out/bench.log" >&2; exit 1; }

perf record -a -g -F 499 -o "$out/perf.data" -- sleep 8 2> "$out/perf-record.log"
# The flat profile: self time by process, binary and function (perf.data keeps the stacks).
perf report -i "$out/perf.data" --no-children -g none --percent-limit 0.2 \
  --sort comm,dso,sym --stdio 2>/dev/null | { grep -v -e '^#' -e '^$' || true; } > "$out/report.txt"
if command -v inferno-collapse-perf >/dev/null && command -v inferno-flamegraph >/dev/null; then
  perf script -i "$out/perf.data" 2>/dev/null | inferno-collapse-perf --all \
    | inferno-flamegraph --title "lockd cluster under $workload" > "$out/flamegraph.svg"
else
  echo "no flamegraph.svg: cargo install inferno for inferno-collapse-perf and inferno-flamegraph" >&2
fi
timeout -s INT 3 perf trace -s -p "$pids" -o "$out/syscalls.txt" 2>/dev/null || true

wait "$bench_pid"
trap - EXIT
echo "profile of $workload in $out: report.txt (CPU), flamegraph.svg, syscalls.txt (system calls per thread), bench/results.md"
