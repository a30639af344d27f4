#!/usr/bin/env bash
# Where one W3 acquire's time goes, step by step (issue 7), or one W2 hand-off's: runs the
# workload with one client style for 20 s, records 2 s of system-call, wake-up and
# context-switch tracepoints on every CPU, and prints the median time to each step
# (bench/timeline.py): in W3 from the client's request, in W2 from each of the leader's log
# writes (an entry, which in W2 is one hand-off) up to its next:
#   - timeline.txt: the steps, in the order their medians fall, each wake-up with how long its
#     thread then waited for a CPU, and those waits for every thread of the run (session 24);
#   - trace.txt: the raw events (perf script), trace.data: the recording;
#   - bench/: lock-bench's own table for the run.
#
# Usage: bench/timeline.sh [OUT_DIR] [DATA_ROOT] [w3|w2] [pipeline|unary]
#        (default: bench-timeline, the temp dir, w3, pipeline)
# DATA_ROOT on tmpfs (/dev/shm) takes the disk out: what is left is the software and the
# wake-ups. Needs: perf (Debian: linux-perf), python3, root or kernel.perf_event_paranoid <= 1,
# and a release build (cargo build --release -p lockd -p lock-bench; LOCKD_BIN picks another
# lockd). Tracing adds a few microseconds to each traced call.
set -euo pipefail

out=${1:-bench-timeline}
data_root=${2:-${TMPDIR:-/tmp}}
workload=${3:-w3}
client=${4:-pipeline}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/perf-tools.sh
. "$here/perf-tools.sh"
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 2; }

# The chosen workload runs 20 s, the others 1 s; `lead` is when perf may start.
workload_window "$workload"
case "$workload" in
  w3) anchor=request ;;
  w2) anchor=entry ;;
  *) echo "workload must be w3 or w2, not $workload" >&2; exit 2 ;;
esac
client_style "$client"

mkdir -p "$out"
"$bench" --systems lockd --lockd-bin "$lockd" --client "$client" --data-root "$data_root" \
  "${secs[@]}" --w4-secs 1 --w4-sessions 10 --warmup-secs 1 \
  --out "$out/bench" > "$out/bench.log" 2>&1 &
bench_pid=$!
trap 'kill "$bench_pid" 2>/dev/null || true' EXIT

sleep "$lead"
nodes=$(pgrep -d, -f "$lockd run" || true)
[ -n "$nodes" ] || { echo "no lockd nodes found; see $out/bench.log" >&2; exit 1; }

events=syscalls:sys_enter_writev,syscalls:sys_exit_recvfrom,syscalls:sys_enter_pwrite64
events=$events,syscalls:sys_enter_fdatasync,syscalls:sys_exit_fdatasync,sched:sched_wakeup,sched:sched_switch
perf record -a -e "$events" -o "$out/trace.data" -- sleep 2 2> "$out/perf-record.log"
perf script -i "$out/trace.data" -F comm,pid,tid,cpu,time,event,trace > "$out/trace.txt" 2>/dev/null
python3 "$here/timeline.py" "$out/trace.txt" "$bench_pid" "$nodes" "$anchor" > "$out/timeline.txt"

wait "$bench_pid"
trap - EXIT
cat "$out/timeline.txt"
echo "timeline of $workload ($client) in $out: timeline.txt, trace.txt, bench/results.md"
