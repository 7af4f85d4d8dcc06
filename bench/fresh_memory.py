"""What this machine charges for fresh memory: the cost a restore pays beside the disk.

A restore reads every tensor into memory of its own, so each page is faulted in (zeroed, and
on a VM backed by the host) before the disk fills it. On this project's VMs that cost is not
fixed: the first few GiB come cheaply, and beyond them each GiB costs several times more
(most likely memory the host has taken back: these VMs boot with free page reporting). This
measures it, so that restore times at several GB can be read against it.

Each round is a fresh process that faults memory in 1 GiB at a time and keeps it (as a
restore keeps its tensors), then frees it all and at once does the same again. The table
gives, per GiB, the median [range] over the rounds of the wall time and the kernel time of
each pass. The second pass always follows the first: its point is memory just freed.

    python bench/fresh_memory.py               # up to 12 GiB (less if memory is short), 3 rounds
    python bench/fresh_memory.py --gib 8 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time

GIB = 1 << 30
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14; Python 3.13 names it
SPARE_GIB = 3  # left to the machine's other users


def fault_in(gib: int) -> list[tuple[float, float]]:
    """Fault in ``gib`` GiB of fresh private memory, 1 GiB at a time, keeping each; returns
    (wall s, kernel s) per GiB. The memory is freed when the returned maps are dropped."""
    held: list[mmap.mmap] = []
    costs = []
    for _ in range(gib):
        memory = mmap.mmap(-1, GIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        kernel_before, started = os.times().system, time.perf_counter()
        memory.madvise(MADV_POPULATE_WRITE)
        costs.append((time.perf_counter() - started, os.times().system - kernel_before))
        held.append(memory)
    for memory in held:
        memory.close()
    return costs


def child(gib: int) -> None:
    first = fault_in(gib)
    again = fault_in(gib)  # right after freeing the same amount
    print(json.dumps({"first": first, "again": again}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=int, default=12, help="GiB to fault in (default 12)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes (default 3)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    # The benchmark's own helpers; imported here, so a child process does not load them.
    from bench_checkpoint import available_gb, cell
    from workload import GB

    available_gib = int(available_gb() * GB // GIB)
    gib = min(args.gib, available_gib - SPARE_GIB)  # a pass holds all of it, one at a time
    if gib < 1:
        sys.exit("not enough memory available for 1 GiB")
    if gib < args.gib:
        print(f"(only {gib} GiB: the machine has {available_gib} GiB available)")
    rounds = []
    for _ in range(args.rounds):
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(gib)], capture_output=True, check=True
        )
        rounds.append(json.loads(out.stdout))
    print(f"\n{args.rounds} fresh processes, {os.cpu_count()} CPUs; median [min-max] seconds\n")
    print("| GiB | first touch s | kernel s | right after freeing s | kernel s |")
    print("|---|---|---|---|---|")
    for i in range(gib):
        samples = [
            [r[which][i][part] for r in rounds] for which in ("first", "again") for part in (0, 1)
        ]
        cells = [cell((statistics.median(v), min(v), max(v)), ".2f", True) for v in samples]
        print(f"| {i + 1} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
