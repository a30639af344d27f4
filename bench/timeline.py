#!/usr/bin/env python3
"""Where one W3 acquire's time goes, step by step (issue 7).

Reads `perf script -F comm,pid,tid,cpu,time,event,trace` output of the tracepoints that
bench/timeline.sh records (writev and pwrite64 entry, recvfrom exit, fdatasync entry and exit,
sched_wakeup) while lock-bench runs W3 (one client, one call at a time), and prints, for every
kind of step, the median time from the client's `writev` of a request to that step, in the
order the medians fall. A step kind is "who, which thread, which call" plus "#n" for its n-th
occurrence within the same request (a wake-up is named by the thread woken); only kinds seen in at least half of the requests are
printed. Roles: C is lock-bench, L the leader (the node that reads first after the client
writes), F1 and F2 the followers.

Usage: timeline.py TRACE_TXT CLIENT_PID NODE_PID,NODE_PID,NODE_PID
"""

import collections
import re
import statistics
import sys

LINE = re.compile(r"^\s*(\S.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
WAKE_TARGET = re.compile(r"pid=(\d+)")

# What each traced call means for the request, for the printed labels.
CALLS = {
    "sys_enter_writev": "writev (sends)",
    "sys_exit_recvfrom": "recvfrom returns (reads)",
    "sys_enter_pwrite64": "pwrite64 (writes the log)",
    "sys_enter_fdatasync": "fdatasync begins",
    "sys_exit_fdatasync": "fdatasync ends",
}


def parse(path):
    """(time_ms, comm, pid, tid, event, rest) per traced event, in file order."""
    events = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                comm, pid, tid, _cpu, t, name, rest = m.groups()
                events.append((float(t) * 1e3, comm.strip(), int(pid), int(tid), name.split(":")[-1], rest))
    events.sort(key=lambda e: e[0])
    return events


def leader_of(events, client, nodes):
    """The node whose `recvfrom` most often comes first after a client `writev`."""
    votes = collections.Counter()
    waiting = False
    for _t, _comm, pid, _tid, name, _rest in events:
        if pid == client and name == "sys_enter_writev":
            waiting = True
        elif waiting and pid in nodes and name == "sys_exit_recvfrom":
            votes[pid] += 1
            waiting = False
    if not votes:
        sys.exit("no client request reached a node: is this a W3 trace with the right pids?")
    return votes.most_common(1)[0][0]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    events = parse(sys.argv[1])
    client = int(sys.argv[2])
    nodes = [int(p) for p in sys.argv[3].split(",")]
    leader = leader_of(events, client, nodes)
    followers = [p for p in nodes if p != leader]
    role = {client: "C", leader: "L"}
    role.update({p: f"F{i + 1}" for i, p in enumerate(followers)})
    thread_comm = {}
    thread_pid = {}
    for _t, comm, pid, tid, _name, _rest in events:
        thread_comm[tid] = comm
        thread_pid[tid] = pid

    def thread(tid):
        comm = thread_comm.get(tid, "?")
        return "flush thread" if comm.startswith("lockd-log-flus") else "runtime"

    starts = [i for i, e in enumerate(events) if e[2] == client and e[4] == "sys_enter_writev"]
    steps = collections.defaultdict(list)
    requests = 0
    for k, first in enumerate(starts):
        t0 = events[first][0]
        last = starts[k + 1] if k + 1 < len(starts) else len(events)
        seen = collections.Counter()
        found = []
        for t, _comm, pid, tid, name, rest in events[first + 1 : last]:
            who = role.get(pid)
            if who is None:
                continue
            if name == "sched_wakeup":
                m = WAKE_TARGET.search(rest)
                target = int(m.group(1)) if m else 0
                if role.get(thread_pid.get(target)) is None:
                    continue
                # Whoever is on the CPU is named as the waker, even when an interrupt (a
                # disk completion, a packet) does the waking, so only the target counts.
                kind = f"{role[thread_pid[target]]} {thread(target)}: woken"
            elif name in CALLS:
                kind = f"{who} {thread(tid)}: {CALLS[name]}"
            else:
                continue
            seen[kind] += 1
            found.append((kind + (f" #{seen[kind]}" if seen[kind] > 1 else ""), t - t0))
        # Only whole requests: the client read its answer before its next request.
        if not any(kind.startswith("C ") and "recvfrom" in kind for kind, _ in found):
            continue
        requests += 1
        for kind, dt in found:
            steps[kind].append(dt)
    if requests == 0:
        sys.exit("no whole request in the trace")
    print(f"{requests} requests; leader pid {leader}, followers {followers}, client pid {client}")
    print("median ms after the client's writev, step (requests that had it)")
    rows = sorted(
        (statistics.median(times), kind, len(times))
        for kind, times in steps.items()
        if len(times) >= requests / 2
    )
    for median, kind, count in rows:
        print(f"{median:8.3f}  {kind} ({count})")


if __name__ == "__main__":
    main()
