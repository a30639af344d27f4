#!/usr/bin/env python3
"""How long this machine's disk makes an fdatasync wait, with nothing of lockd running.

Writes 4 KiB at a time into a preallocated 64 MiB file and fdatasyncs after each write, for
SECS seconds, optionally sleeping GAP seconds between syncs (a lower sync rate). Prints every
sync over 50 ms as it happens, then the distribution. Session 23 used it to show that this VM's
virtual disk stalls for up to 0.9 s under a sustained high sync rate (the three nodes of a
benchmark sync ~3,300 times a second in W1) and not at ~400 syncs a second.

Usage: bench/fsync-stalls.py SECS [GAP] [DIR]   (DIR: default $TMPDIR or /tmp; use the disk
the nodes' data goes to)
"""
import os
import sys
import tempfile
import time

FILE_BYTES = 64 << 20
WRITE = b"x" * 4096
SLOW = 0.05


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    secs = float(sys.argv[1])
    gap = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    where = sys.argv[3] if len(sys.argv) > 3 else tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="fsync-stalls-", dir=where)
    try:
        os.posix_fallocate(fd, 0, FILE_BYTES)
        os.fsync(fd)
        took = []
        offset = 0
        end = time.monotonic() + secs
        while time.monotonic() < end:
            os.pwrite(fd, WRITE, offset)
            offset = (offset + len(WRITE)) % FILE_BYTES
            start = time.monotonic()
            os.fdatasync(fd)
            d = time.monotonic() - start
            took.append(d)
            if d > SLOW:
                print(f"{time.strftime('%H:%M:%S')} fdatasync took {d * 1000:.0f} ms", flush=True)
            if gap:
                time.sleep(gap)
    finally:
        os.close(fd)
        os.unlink(path)
    took.sort()
    n = len(took)
    if n == 0:
        sys.exit("no sync completed")

    def ms(q: float) -> str:
        return f"{took[min(n - 1, int(n * q))] * 1000:.3f}"

    print(
        f"{n} syncs in {secs:g} s ({n / secs:.0f}/s): p50 {ms(0.5)} ms, p99 {ms(0.99)} ms, "
        f"p99.9 {ms(0.999)} ms, max {took[-1] * 1000:.1f} ms; over 100 ms: "
        f"{sum(1 for d in took if d > 0.1)}, over 300 ms: {sum(1 for d in took if d > 0.3)}"
    )


if __name__ == "__main__":
    main()
