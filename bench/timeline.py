#!/usr/bin/env python3
"""Where one W3 acquire's time goes, step by step (issue 7), or one W2 hand-off's (session 25).

Reads `perf script -F comm,pid,tid,cpu,time,event,trace` output of the tracepoints that
bench/timeline.sh records (writev and pwrite64 entry, recvfrom exit, fdatasync entry and exit,
sched_wakeup, sched_switch) while lock-bench runs W3 (one client, one call at a time), and
prints, for every kind of step, the median time from the client's `writev` of a request to
that step, in the order the medians fall. A step kind is "who, which thread, which call" plus
"#n" for its n-th occurrence within the same request; a wake-up is named by the thread woken,
and the time from a wake-up to that thread's next switch-in is the time it waited for a CPU,
printed beside the wake-up. Only kinds seen in at least half of the requests (or entries) are
printed. Roles: C is lock-bench, L the leader (the node that reads first after the client
writes), F1 and F2 the followers.

It then prints how long each role's threads waited for a CPU after a wake-up (median, mean, 90th
percentile, and the share of wake-ups that found their CPU running another thread), over every
wake-up in the trace. A wait includes waking an idle virtual CPU, which costs a few
microseconds on a virtual machine.

With ANCHOR `entry` (W2, bench/timeline.sh's w2), the steps are timed from each of the leader's
log writes instead, up to its next: one entry, which in W2 is one hand-off (the release that
closed it, its commit, the answers to the releaser and to the next holder, and that holder's
release, which closes the next entry). It then also prints the median time between the leader's
log writes, the hand-off's whole time.

Usage: timeline.py TRACE_TXT CLIENT_PID NODE_PID,NODE_PID,NODE_PID [request|entry]
"""

import collections
import re
import statistics
import sys

LINE = re.compile(r"^\s*(\S.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
WAKE_TARGET = re.compile(r"\bpid=(\d+)")
SWITCH_IN = re.compile(r"next_pid=(\d+)")
TARGET_CPU = re.compile(r"target_cpu=(\d+)")
WOKEN_COMM = re.compile(r"(?:^|next_)comm=(\S+) (?:next_)?pid=(\d+)")


def number_in(pattern, rest, missing=0):
    """The number `pattern` names in a scheduler event's text (the pid of the thread woken or
    switched in, the CPU it is woken onto), or `missing` when it names none."""
    m = pattern.search(rest)
    return int(m.group(1)) if m else missing


# What each traced call means for the request, for the printed labels.
CALLS = {
    "sys_enter_writev": "writev (sends)",
    "sys_exit_recvfrom": "recvfrom returns (reads)",
    "sys_enter_pwrite64": "pwrite64 (writes the log)",
    "sys_enter_fdatasync": "fdatasync begins",
    "sys_exit_fdatasync": "fdatasync ends",
}


def parse(path):
    """(time_ms, comm, pid, tid, event, rest, cpu) per traced event, in time order."""
    events = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                comm, pid, tid, cpu, t, name, rest = m.groups()
                events.append(
                    (float(t) * 1e3, comm.strip(), int(pid), int(tid), name.split(":")[-1], rest, int(cpu))
                )
    events.sort(key=lambda e: e[0])
    return events


def leader_of(events, client, nodes):
    """The node whose `recvfrom` most often comes first after a client `writev`."""
    votes = collections.Counter()
    waiting = False
    for _t, _comm, pid, _tid, name, _rest, _cpu in events:
        if pid == client and name == "sys_enter_writev":
            waiting = True
        elif waiting and pid in nodes and name == "sys_exit_recvfrom":
            votes[pid] += 1
            waiting = False
    if not votes:
        sys.exit("no client request reached a node: is this a W3 trace with the right pids?")
    return votes.most_common(1)[0][0]


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    anchor = sys.argv[4] if len(sys.argv) == 5 else "request"
    if anchor not in ("request", "entry"):
        sys.exit(f"ANCHOR must be request or entry, not {anchor}\n{__doc__}")
    events = parse(sys.argv[1])
    client = int(sys.argv[2])
    nodes = [int(p) for p in sys.argv[3].split(",")]
    leader = leader_of(events, client, nodes)
    followers = [p for p in nodes if p != leader]
    role = {client: "C", leader: "L"}
    role.update({p: f"F{i + 1}" for i, p in enumerate(followers)})
    thread_comm = {}
    thread_pid = {}
    for _t, comm, pid, tid, _name, rest, _cpu in events:
        thread_comm[tid] = comm
        thread_pid[tid] = pid
        # A thread first seen being woken or switched in is named by that event.
        m = WOKEN_COMM.search(rest)
        if m:
            thread_comm.setdefault(int(m.group(2)), m.group(1))

    def thread(tid):
        comm = thread_comm.get(tid, "?")
        return "flush thread" if comm.startswith("lockd-log-flus") else "runtime"

    if anchor == "request":
        starts = [i for i, e in enumerate(events) if e[2] == client and e[4] == "sys_enter_writev"]
        unit, units, origin = "request", "requests", "the client's writev"
    else:
        starts = [
            i
            for i, e in enumerate(events)
            if e[2] == leader and e[4] == "sys_enter_pwrite64" and thread(e[3]) == "runtime"
        ]
        unit, units, origin = "entry", "entries", "the leader's log write"
    steps = collections.defaultdict(list)
    # For each wake-up step: how long the thread woken waited before it was on a CPU.
    waits = collections.defaultdict(list)
    whole = 0
    periods = []
    for k, first in enumerate(starts):
        # The last log write's entry runs past the trace's end: not a whole one.
        if anchor == "entry" and k + 1 == len(starts):
            break
        t0 = events[first][0]
        last = starts[k + 1] if k + 1 < len(starts) else len(events)
        seen = collections.Counter()
        found = []
        pending = {}
        waited = []
        for t, _comm, pid, tid, name, rest, _cpu in events[first + 1 : last]:
            if name == "sched_switch":
                target = number_in(SWITCH_IN, rest)
                if target in pending:
                    label, woken_at = pending.pop(target)
                    waited.append((label, t - woken_at))
                continue
            if name == "sched_wakeup":
                target = number_in(WAKE_TARGET, rest)
                if role.get(thread_pid.get(target)) is None:
                    continue
                # Whoever is on the CPU is named as the waker, even when an interrupt (a
                # disk completion, a packet) does the waking or the CPU was idle, so only the
                # target counts.
                kind = f"{role[thread_pid[target]]} {thread(target)}: woken"
            elif role.get(pid) is None or name not in CALLS:
                continue
            else:
                kind = f"{role[pid]} {thread(tid)}: {CALLS[name]}"
            seen[kind] += 1
            label = kind + (f" #{seen[kind]}" if seen[kind] > 1 else "")
            found.append((label, t - t0))
            if name == "sched_wakeup":
                pending[target] = (label, t)
        # Only whole requests: the client read its answer before its next request (an entry:
        # before the leader's next log write, which the trace holds).
        if not any(kind.startswith("C ") and "recvfrom" in kind for kind, _ in found):
            continue
        if anchor == "entry":
            periods.append(events[last][0] - t0)
        whole += 1
        for kind, dt in found:
            steps[kind].append(dt)
        for label, dt in waited:
            waits[label].append(dt)
    if whole == 0:
        sys.exit(f"no whole {unit} in the trace")
    print(f"{whole} {units}; leader pid {leader}, followers {followers}, client pid {client}")
    if periods:
        print(f"median ms from one of the leader's log writes to its next: {statistics.median(periods):.3f}")
    print(f"median ms after {origin}, step ({units} that had it)")
    print("  a wake-up also shows how long the thread then waited for a CPU: median, mean")
    rows = sorted(
        (statistics.median(times), kind, len(times))
        for kind, times in steps.items()
        if len(times) >= whole / 2
    )
    for median, kind, count in rows:
        wait = waits.get(kind)
        note = ""
        if wait:
            note = f"  [waited {statistics.median(wait):.3f}, mean {statistics.mean(wait):.3f}]"
        print(f"{median:8.3f}  {kind} ({count}){note}")
    print_cpu_waits(events, role, thread_pid, thread)


def print_cpu_waits(events, role, thread_pid, thread):
    """How long each role's threads waited for a CPU between a wake-up and running."""
    woken = {}
    busy = {}
    running = {}
    waits = collections.defaultdict(list)
    onto_busy = collections.Counter()
    for t, _comm, _pid, _tid, name, rest, cpu in events:
        if name == "sched_switch":
            target = number_in(SWITCH_IN, rest)
            running[cpu] = target
            if target in woken:
                waits[target].append(t - woken.pop(target))
                onto_busy[target] += busy.pop(target)
        elif name == "sched_wakeup":
            target = number_in(WAKE_TARGET, rest)
            onto = number_in(TARGET_CPU, rest, missing=-1)
            woken[target] = t
            busy[target] = running.get(onto, 0) not in (0, target)
    by_kind = collections.defaultdict(list)
    busy_kind = collections.Counter()
    for tid, times in waits.items():
        who = role.get(thread_pid.get(tid))
        if who is None:
            continue
        kind = f"{who} {thread(tid)}"
        by_kind[kind].extend(times)
        busy_kind[kind] += onto_busy[tid]
    print(
        "every wake-up in the trace: wait for a CPU in ms, median, mean, 90th percentile"
        " (wake-ups; share that found their CPU running another thread)"
    )
    for kind in sorted(by_kind):
        times = sorted(by_kind[kind])
        n = len(times)
        print(
            f"{statistics.median(times):8.3f} {statistics.mean(times):8.3f} {times[n * 9 // 10]:8.3f}  {kind} "
            f"({n}; {100 * busy_kind[kind] / n:.0f} %)"
        )


if __name__ == "__main__":
    main()
