#!/usr/bin/env python3
"""Where the lockd nodes' CPU goes, by layer (issue 23): reads `perf script -F comm,pid,ip,sym`
output of samples with DWARF call graphs (bench/layers.sh records them) and counts each sample
once, in the layer of its innermost frames:

- a sample in the kernel goes to the kind of system call it is in (socket read, socket write,
  `fdatasync`, the WAL's `pwrite`), or to wake-ups, scheduling and interrupts when it is in
  none of those (epoll and futex waits, context switches, softirqs, timer interrupts);
- a sample in user space goes to the first frame, innermost first, that belongs to a known
  crate: lockd's own code, openraft, HTTP/2 and gRPC, TLS, tokio; the allocator and memory
  copies by their symbols.

A cpu-clock sample taken while user code ran carries the timer interrupt's kernel frames on
top of the user stack; they are the sampling, not the work, and are dropped.

Usage: layers.py SCRIPT_TXT [CPU_MS_PER_UNIT]
Prints a Markdown table: each layer's share of all samples, of the busiest process (the
leader) and of the others (the followers); with CPU_MS_PER_UNIT (for example the run's server
CPU per pair) also each layer's microseconds per unit.
"""

import collections
import sys

# A frame belongs to the crate its symbol starts with (`<lockd::X as openraft::Y>::f` is lockd's
# code, `openraft::f<lock_raft_store::TypeConfig>` openraft's); frames of `core`, `alloc`, `std`
# and unknown crates are passed over for the next one out.
OWN = "lockd's own code (serving, apply, log store and codec, Raft transport)"
CRATES = [
    ("tokio_rustls", "TLS (rustls, ring)"),
    ("rustls", "TLS (rustls, ring)"),
    ("ring", "TLS (rustls, ring)"),
    ("lock_raft_store", OWN),
    ("lock_proto", OWN),
    ("lock_api", OWN),
    ("lockd", OWN),
    ("openraft", "openraft"),
    ("h2", "HTTP/2 and gRPC (h2, hyper, tonic, prost)"),
    ("hyper", "HTTP/2 and gRPC (h2, hyper, tonic, prost)"),
    ("tonic", "HTTP/2 and gRPC (h2, hyper, tonic, prost)"),
    ("tower", "HTTP/2 and gRPC (h2, hyper, tonic, prost)"),
    ("prost", "HTTP/2 and gRPC (h2, hyper, tonic, prost)"),
    ("tokio", "tokio (scheduler, timers, IO driver)"),
    ("mio", "tokio (scheduler, timers, IO driver)"),
]
ALLOCATOR = "allocator and copies"
WAKEUPS = "kernel: wake-ups, scheduling, interrupts"
OTHER = "other user code"
ORDER = [
    OWN,
    "openraft",
    "HTTP/2 and gRPC (h2, hyper, tonic, prost)",
    "TLS (rustls, ring)",
    "tokio (scheduler, timers, IO driver)",
    ALLOCATOR,
    "kernel: socket reads and writes (loopback TCP)",
    WAKEUPS,
    "disk: `fdatasync` and WAL `pwrite`",
    OTHER,
]


def read_samples(path):
    """Yields (pid, frames) per sample; kernel frames are prefixed with 'K:'."""
    head, frames = None, []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                if head:
                    yield head, frames
                head, frames = None, []
            elif not line[0].isspace():
                fields = line.split()
                head, frames = (fields[1] if len(fields) > 1 else "?"), []
            else:
                parts = line.strip().split(None, 1)
                sym = (parts[1] if len(parts) > 1 else "?").rsplit(" (", 1)[0]
                frames.append(("K:" + sym) if parts[0].startswith("ffffffff") else sym)
    if head:
        yield head, frames


def kernel_layer(kframes):
    """The layer of a sample whose innermost frame is in the kernel."""
    syscall = ""
    if "do_syscall_64" in kframes:
        k = kframes.index("do_syscall_64")
        syscall = kframes[k - 1] if k > 0 else ""
    joined = " ".join(kframes)
    if "fsync" in joined or "fdatasync" in joined or "pwrite" in syscall:
        return "disk: `fdatasync` and WAL `pwrite`"
    if "recvfrom" in syscall or "tcp_recvmsg" in joined or "writev" in syscall \
            or "sendmsg" in syscall or "tcp_sendmsg" in joined:
        return "kernel: socket reads and writes (loopback TCP)"
    return WAKEUPS


def layer(frames):
    """The layer of one sample's frames (innermost first)."""
    tick = [i for i, f in enumerate(frames) if f == "K:asm_sysvec_apic_timer_interrupt"]
    if tick and tick[-1] + 1 < len(frames) and not frames[tick[-1] + 1].startswith("K:"):
        frames = frames[tick[-1] + 1:]
    if not frames:
        return OTHER
    if frames[0].startswith("K:"):
        return kernel_layer([f[2:] for f in frames if f.startswith("K:")])
    leaf = frames[0]
    if leaf.startswith(("mi_", "_mi_")) or leaf in (
            "malloc", "free", "cfree@GLIBC_2.2.5", "_int_malloc", "_int_free", "realloc") \
            or "memmove" in leaf or "memcpy" in leaf or "memset" in leaf:
        return ALLOCATOR
    for frame in frames:
        crate = frame.lstrip("<&*( ").split("::", 1)[0]
        for prefix, name in CRATES:
            if crate == prefix or crate.startswith(prefix + "_"):
                return name
    return OTHER


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    per_unit = float(sys.argv[2]) if len(sys.argv) == 3 else None
    counts = collections.defaultdict(collections.Counter)
    for pid, frames in read_samples(sys.argv[1]):
        counts[pid][layer(frames)] += 1
    total = sum(sum(c.values()) for c in counts.values())
    if total == 0:
        sys.exit(f"no samples in {sys.argv[1]}")
    pids = sorted(counts, key=lambda p: -sum(counts[p].values()))
    leader = pids[0]
    print(f"{total} samples; processes by samples: "
          + ", ".join(f"{p} ({sum(counts[p].values())})" for p in pids)
          + f"; the leader is taken to be {leader}, the busiest\n")
    unit = " (µs per unit)" if per_unit else ""
    print(f"| layer | all{unit} | leader | others |")
    print("|---|---:|---:|---:|")
    for name in ORDER:
        n = sum(counts[p][name] for p in pids)
        if n == 0:
            continue
        share = 100 * n / total
        cell = f"{share:.1f} %" + (f" ({per_unit * share * 10:.0f} µs)" if per_unit else "")
        lead = 100 * counts[leader][name] / total
        rest = 100 * sum(counts[p][name] for p in pids[1:]) / total
        print(f"| {name} | {cell} | {lead:.1f} % | {rest:.1f} % |")


if __name__ == "__main__":
    main()
