"""Benchmark: save and restore a live notebook namespace, jupyter_pause against its peers and
against the device itself, in rotated rounds.

Every round runs the device reference and every method, each as a SAVE process (build the
state, checkpoint, change a scalar, checkpoint again) and, after the page cache is dropped, a
RESTORE process (a fresh process until the state is usable). Rounds follow a balanced order
(a Williams design): every method runs right after every other one at least once, so no
method always inherits the same predecessor's memory and cache state. Fractions divide by the
device reference of the same round. Prints a markdown table (medians, [min-max]) and writes
bench/results/latest.{md,json}.

    python bench/bench_checkpoint.py                 # ~710 MB of state, all peers
    python bench/bench_checkpoint.py --gb 4          # 4 GB of state
    python bench/bench_checkpoint.py --quick         # smoke run, ~7 MB, one round
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from methods import METHOD_CLASSES, run_child  # noqa: E402
from workload import GB, MB, drop_page_cache, expected_bytes, scale_for_gb, tree_files  # noqa: E402

RESULTS = HERE / "results"
REFERENCE = "device"

# Targets jupyter_pause is held to (see bench/README.md).
TARGET_SAVE_FRACTION = 0.8
TARGET_RESTORE_FRACTION = 0.65
TARGET_INCREMENTAL_S = 0.1
TARGET_EXTRA_SAVE_MB = 64.0
# An incremental checkpoint may write metadata (manifest, the scalar) but no tensor/array data.
INCREMENTAL_BYTES_ALLOWANCE = 256 * 1024

PEERS = ("pickle", "dill", "torch", "safetensors", "kishu")
METHODS = ("jupyter_pause", *PEERS)
# Peak memory of a method's processes, as (times the state, plus GB): pickling peers hold a
# serialized copy of each storage next to it; jupyter_pause streams from the tensors.
MEMORY_NEED = {
    "device": (1.1, 1.5),
    "pickle": (2.2, 1.5),
    "dill": (2.2, 1.5),
    "torch": (2.2, 1.5),
    "safetensors": (2.2, 1.5),
    "kishu": (3.0, 2.0),
}
_PAUSE_NEED = (1.15, 1.5)
MEMORY_SPARE_GB = 2.0  # left to the machine's other users


# --------------------------------------------------------------------------- round order


def williams_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` items in which every item follows every other one exactly once
    (twice for odd ``n``, which needs the mirrored square too)."""
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(item + shift) % n for item in first] for shift in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def round_orders(items: list[str], rounds: int) -> list[list[str]]:
    """At least ``rounds`` orders, cycling through a Williams design of ``items``."""
    design = williams_orders(len(items))
    count = max(rounds, 1)
    return [[items[i] for i in design[r % len(design)]] for r in range(count)]


def successions(orders: list[list[str]]) -> set[tuple[str, str]]:
    """(before, after) pairs that ran back to back, across round boundaries too."""
    flat = [item for order in orders for item in order]
    return set(itertools.pairwise(flat))


# --------------------------------------------------------------------------- children


def spawn(
    args: argparse.Namespace, kind: str, method: str, store: Path, round_no: int
) -> dict[str, Any]:
    out = store.parent / f"{method}.{kind}.json"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        *("--child", kind, "--method", method, "--store", str(store), "--out", str(out)),
        *("--scale", str(args.scale), "--round", str(round_no)),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{kind} timed out after {args.timeout}s"}
    if proc.returncode != 0 or not out.exists():
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        if args.verbose:
            print(proc.stderr[-4000:], file=sys.stderr)
        return {"error": f"{kind} failed: {tail[0][:160]}"}
    return json.loads(out.read_text())


def run_method(args: argparse.Namespace, work: Path, method: str, round_no: int) -> dict[str, Any]:
    """One save process and one restore process of a method, the page cache dropped between."""
    store = work / method
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    try:
        saved = spawn(args, "save", method, store, round_no)
        if "error" in saved:
            return saved
        time.sleep(args.age)  # files that sat a while read slower on some virtual disks
        cache = "kept (--warm)" if args.warm else drop_page_cache(tree_files(store))
        restored = spawn(args, "restore", method, store, round_no)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    if "error" in restored:
        return {**saved, "error": restored["error"]}
    ok = None
    if restored["fingerprint"] is not None:
        ok = restored["fingerprint"] == saved["fingerprint"]
    notes = [n for n in (saved["note"], restored.get("note")) if n]
    note = "; ".join(dict.fromkeys(notes))  # the shim note comes from both processes
    return {**saved, "restore": restored, "cache": cache, "ok": ok, "note": note}


# --------------------------------------------------------------------------- numbers


def device_speeds(run: dict[str, Any]) -> dict[str, float]:
    """Seconds of the device reference: each way, and the best of the two per direction."""
    saved, restored = run["reported"], run["restore"]["reported"]
    out = {key: value for key, value in {**saved, **restored}.items() if key.endswith("_s")}
    out["write_s"] = min(saved["write_direct_s"], saved["write_buffered_s"])
    out["read_s"] = min(restored["read_direct_s"], restored["read_buffered_s"])
    return out


def derive(run: dict[str, Any], reference: dict[str, float] | None) -> dict[str, Any]:
    """One run's columns; fractions against the device reference of the same round."""
    if "save" not in run or "restore" not in run:
        return {}
    sb = run["state_bytes"]
    if "write_direct_s" in run["reported"]:  # the reference itself
        speeds = device_speeds(run)
        return {
            "save_s": speeds["write_s"],
            "restore_s": speeds["read_s"],
            "save_frac": 1.0,
            "restore_frac": 1.0,
            "state_mb": sb / MB,
            **speeds,
        }
    restore = run["restore"]
    d = {
        "save_s": run["save"]["seconds"],
        "restore_s": restore["seconds"],
        "disk_mb": run["disk_bytes_first"] / MB,
        "extra_mb": run["save"]["extra_peak"] / MB,
        "restore_extra_mb": (restore["peak_rss"] - restore["rss_before"] - sb) / MB,
        "incr_s": run["incremental"]["seconds"],
        "incr_bytes": incremental_bytes(run),
        "state_mb": sb / MB,
        "ok": run["ok"],
    }
    if run.get("paired_write_s"):  # absent in runs from before it was measured
        d["paired_frac"] = run["paired_write_s"] / d["save_s"]
    if reference is not None:
        d["save_frac"] = reference["write_s"] / d["save_s"]
        d["restore_frac"] = reference["read_s"] / d["restore_s"]
        if "read_fresh_s" in reference:  # absent in runs from before it was measured
            d["fresh_frac"] = reference["read_fresh_s"] / d["restore_s"]
    return d


def incremental_bytes(row: dict[str, Any]) -> int:
    """Largest of: write() bytes (misses mmap writes), disk growth (misses overwrites) and what
    the method itself reports, so no way of writing goes unseen."""
    inc = row["incremental"]
    reported = row.get("reported", {}).get("save2", {}).get("bytes_written", 0)
    return max(inc["wchar"], inc["disk_growth"], reported or 0)


def summarize(derived: list[dict[str, Any]]) -> dict[str, Any]:
    """Per column: median, min and max over the rounds; 'ok' only if every round was."""
    good = [d for d in derived if d]
    out: dict[str, Any] = {"rounds": len(good)}
    for key in good[0] if good else ():
        values = [d[key] for d in good if key in d]
        if key == "ok":
            out[key] = all(values)
        elif values:
            out[key] = (statistics.median(values), min(values), max(values))
    return out


def check_targets(s: dict[str, Any]) -> dict[str, bool]:
    """jupyter_pause's targets, on the medians."""
    return {
        "save_frac": s["save_frac"][0] >= TARGET_SAVE_FRACTION,
        "restore_frac": s["restore_frac"][0] >= TARGET_RESTORE_FRACTION,
        "extra_mb": s["extra_mb"][0] <= TARGET_EXTRA_SAVE_MB,
        "incr_s": s["incr_s"][0] <= TARGET_INCREMENTAL_S,
        "incr_bytes": s["incr_bytes"][0] <= INCREMENTAL_BYTES_ALLOWANCE,
    }


# --------------------------------------------------------------------------- the report

COLUMNS = [
    ("save s", "save_s", ".2f", True),
    ("save / device (>=0.8)", "save_frac", ".2f", True),
    ("save / same-process write", "paired_frac", ".2f", True),
    ("restore s (usable)", "restore_s", ".2f", True),
    ("restore / device (>=0.65)", "restore_frac", ".2f", True),
    ("restore / fresh read", "fresh_frac", ".2f", False),
    ("extra save MB (<=64)", "extra_mb", ".0f", True),
    ("extra restore MB", "restore_extra_mb", ".0f", False),
    ("disk MB", "disk_mb", ".0f", False),
    ("incr s (<=0.1)", "incr_s", ".3f", False),
    ("incr bytes (~0)", "incr_bytes", ",.0f", False),
]


def cell(value: Any, spec: str, with_range: bool) -> str:
    if value is None:
        return "n/a"
    median, low, high = value
    if not with_range or low == high:
        return format(median, spec)
    return f"{median:{spec}} [{low:{spec}}-{high:{spec}}]"


def render(results: dict[str, Any], meta: dict[str, Any]) -> str:
    ref = results[REFERENCE]["summary"]
    lines = [
        f"## Checkpoint benchmark ({meta['when']}, {meta['state_gb']:.2f} GB of state, "
        f"{meta['rounds']} rounds in rotated order, {meta['cpus']} CPUs, 1-min load average "
        f"{meta['loadavg_1min'][0]:.2f} at start / {meta['loadavg_1min'][1]:.2f} at end, "
        f"{meta['mem_available_gb']:.1f} GB memory available at start)",
        "",
        "Device reference, per round (median [min-max] MB/s): "
        + ", ".join(
            f"{label} {cell(speed(ref, key, meta), '.0f', True)}"
            for label, key in (
                ("O_DIRECT write+fsync", "write_direct_s"),
                ("buffered write+fsync", "write_buffered_s"),
                ("O_DIRECT cold read", "read_direct_s"),
                ("buffered cold read", "read_buffered_s"),
                ("O_DIRECT cold read into fresh memory (not in the reference)", "read_fresh_s"),
            )
        )
        + f". Restores start from a page cache dropped with {meta['cache']}.",
        "",
        "| method | " + " | ".join(c[0] for c in COLUMNS) + " | restored ok | targets |",
        "|---" * (len(COLUMNS) + 3) + "|",
    ]
    notes = []
    for name, row in results.items():
        s = row["summary"]
        if not s.get("rounds"):
            lines.append(f"| {name} | n/a: {row['error']} |" + " |" * (len(COLUMNS) + 1))
            continue
        cells = [cell(s.get(key), spec, ranged) for _, key, spec, ranged in COLUMNS]
        if name == REFERENCE:
            verdict, ok = "the fractions' denominators (best of two ways, per round)", "n/a"
        else:
            failed = [k for k, passed in check_targets(s).items() if not passed]
            verdict = "all PASS" if not failed else "misses: " + ", ".join(failed)
            ok = "yes" if s.get("ok") else "NO (fingerprint differs)"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ok} | {verdict} |")
        if row.get("note"):
            notes.append(f"- {name}: {row['note']}")
        if row.get("error"):
            notes.append(f"- {name}: {row['error']}")
    lines += ["", *against_peers(results), "", "Notes:", *notes, *meta["notes"]]
    return "\n".join(lines) + "\n"


def speed(summary: dict[str, Any], key: str, meta: dict[str, Any]) -> tuple[float, ...] | None:
    """Seconds (median, min, max) as MB/s (median, min, max: the slowest run is the min)."""
    if key not in summary:
        return None
    mb = summary["state_mb"][0]
    median, fastest, slowest = summary[key]
    return (mb / median, mb / slowest, mb / fastest)


def against_peers(results: dict[str, Any]) -> list[str]:
    me = results.get("jupyter_pause", {}).get("summary", {})
    if not me.get("rounds"):
        return ["jupyter_pause: no result, so no comparison with peers."]
    out = ["jupyter_pause against every peer (medians, lower is better):", ""]
    for label, key in [
        ("save s", "save_s"),
        ("restore s", "restore_s"),
        ("incr s", "incr_s"),
        ("incr bytes", "incr_bytes"),
        ("extra save MB", "extra_mb"),
        ("extra restore MB", "restore_extra_mb"),
    ]:
        peers = {
            name: row["summary"][key][0]
            for name, row in results.items()
            if name in PEERS and row["summary"].get(key)
        }
        if not peers:
            out.append(f"- {label}: no peer ran")
            continue
        best = min(peers, key=peers.get)
        verdict = "PASS" if me[key][0] < peers[best] else "FAIL"
        out.append(
            f"- {label}: jupyter_pause {me[key][0]:.3g} vs best peer {best} "
            f"{peers[best]:.3g} -> {verdict}"
        )
    return out


# --------------------------------------------------------------------------- orchestration


def memory_need_gb(method: str, state_gb: float) -> float:
    factor, base = MEMORY_NEED.get(method, _PAUSE_NEED)
    return factor * state_gb + base


def available_gb() -> float:
    import psutil

    return psutil.virtual_memory().available / GB


def choose_methods(args: argparse.Namespace, state_gb: float, notes: list[str]) -> list[str]:
    """The methods asked for, less those not installed or whose memory need does not fit."""
    asked = [m for m in (args.methods.split(",") if args.methods else METHODS) if m]
    unknown = sorted(set(asked) - set(METHOD_CLASSES) - {REFERENCE})
    if unknown:
        raise SystemExit(f"unknown methods: {', '.join(unknown)}")
    chosen = []
    free = available_gb() - MEMORY_SPARE_GB
    for method in asked:
        module = {"kishu": "kishu", "dill": "dill", "safetensors": "safetensors"}.get(method)
        if module and importlib.util.find_spec(module) is None:
            notes.append(f"- {method}: not installed here, not run")
            continue
        need = memory_need_gb(method, state_gb)
        if need > free:
            notes.append(
                f"- {method}: skipped, needs ~{need:.1f} GB of memory, "
                f"{free:.1f} GB available (after {MEMORY_SPARE_GB:.0f} GB left to others)"
            )
            continue
        chosen.append(method)
    if memory_need_gb(REFERENCE, state_gb) > free:
        raise SystemExit(f"{state_gb:.1f} GB of state does not fit in {free:.1f} GB")
    return chosen


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    # An installed package comes with bytecode; this checkout may have none (and this
    # machine sets PYTHONDONTWRITEBYTECODE), which would charge restores for compiling it.
    compileall.compile_dir(str(HERE.parent / "jupyter_pause"), quiet=1)
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.profile:
        (RESULTS / "profile").mkdir(parents=True, exist_ok=True)
        os.environ["BENCH_PROFILE_DIR"] = str(RESULTS / "profile")
    state_gb = expected_bytes(args.scale) / GB
    notes: list[str] = []
    mem_available = available_gb()
    methods = choose_methods(args, state_gb, notes)
    items = [REFERENCE, *methods]
    orders = round_orders(items, args.rounds or max(3, len(williams_orders(len(items)))))
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {item: [] for item in items}
    for round_no, order in enumerate(orders):
        for position, item in enumerate(order):
            print(
                f"[bench] round {round_no + 1}/{len(orders)}: {item}", file=sys.stderr, flush=True
            )
            run = run_method(args, work, item, round_no)
            run.update(round=round_no, position=position)
            runs[item].append(run)
    shutil.rmtree(work, ignore_errors=True)
    references = {run["round"]: device_speeds(run) for run in runs[REFERENCE] if "save" in run}
    results: dict[str, Any] = {}
    for item, item_runs in runs.items():
        derived = [derive(run, references.get(run["round"])) for run in item_runs]
        errors = [run["error"] for run in item_runs if run.get("error")]
        notes_of = [run["note"] for run in item_runs if run.get("note")]
        results[item] = {
            "runs": item_runs,
            "summary": summarize(derived),
            "error": errors[0] if errors else "",
            "note": notes_of[0] if notes_of else "",
        }
    pairs = successions(orders)
    missing = [(a, b) for a in items for b in items if a != b and (a, b) not in pairs]
    notes.append(
        "- order: every method ran right after every other one at least once"
        if not missing
        else f"- order: {len(missing)} of {len(items) * (len(items) - 1)} back-to-back pairs "
        f"never ran (use more --rounds), e.g. {missing[0][1]} never right after {missing[0][0]}"
    )
    notes += STANDING_NOTES
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "scale": args.scale,
        "state_gb": state_gb,
        "cpus": os.cpu_count(),
        "rounds": len(orders),
        "orders": orders,
        "loadavg_1min": (load_start, os.getloadavg()[0]),
        "mem_available_gb": mem_available,
        "cache": "kept (--warm)" if args.warm else "fadvise(DONTNEED) + drop_caches",
        "age_s": args.age,
        "python": sys.version.split()[0],
        "notes": notes,
    }
    return {"meta": meta, "results": results}


STANDING_NOTES = [
    "- save s: first checkpoint, serialize + write + fsync of every file and folder it wrote. "
    "restore s: a fresh process from a cold page cache, from before `%load_ext "
    "jupyter_pause` (or importing the peer's library) until every byte of every tensor and "
    "array was read (numpy/torch imports and the shell are off the clock for every method).",
    "- fractions: the device reference's seconds in the same round divided by the method's; "
    "the device takes the best of an O_DIRECT and a buffered write+fsync (and cold read) of "
    "the same bytes, into reused buffers (bench/device.py). save / same-process write: the "
    "device's O_DIRECT write+fsync of the same state from the same memory, in the method's "
    "own process right after its saves, divided by the method's save (not a target; it shows "
    "what the disk did at the moment of the save).",
    "- extra save MB: peak RSS during the first checkpoint minus RSS right before it. extra "
    "restore MB: peak RSS of the restore minus RSS before it minus the state's bytes (the "
    "100k small dicts take ~60 MB more in memory than pickled, the same for every method).",
    "- incr: after the first checkpoint only `lr` changes and a second checkpoint is taken; "
    "peers write everything again. incr bytes = max(write() bytes, disk growth, reported).",
    "- safetensors: every tensor and array in one safetensors file (save_file/load_file), the "
    "rest in a pickle whose tensors are references into it. dill runs in a plain fresh "
    "`__main__` (dump_module of an IPython user module pickles the shell itself).",
]


def write_report(found: dict[str, Any], name: str) -> str:
    md = render(found["results"], found["meta"])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(md)
    (RESULTS / f"{name}.json").write_text(json.dumps(found, indent=1, default=repr))
    return md


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, help="state size in GB (default ~0.71, --scale 1)")
    p.add_argument("--scale", type=float, default=1.0, help="workload size (1.0 = ~710 MB)")
    p.add_argument("--quick", action="store_true", help="smoke run: scale 0.01, one round")
    p.add_argument("--methods", default="", help=f"comma list, default: {','.join(METHODS)}")
    p.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="rounds (default: enough for every method to follow every other, at least 3)",
    )
    p.add_argument("--warm", action="store_true", help="keep the page cache before restores")
    p.add_argument("--age", type=float, default=0, help="seconds between save and restore")
    p.add_argument("--workdir", default=str(RESULTS / "work"), help="scratch dir on the disk")
    p.add_argument("--report", default="latest", help="name of the report in bench/results/")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    p.add_argument("--profile", action="store_true", help="cProfile into bench/results/profile/")
    p.add_argument("--verbose", action="store_true", help="print children's stderr on failure")
    p.add_argument("--child", choices=["save", "restore"], help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.gb:
        args.scale = scale_for_gb(args.gb)
    if args.quick:
        args.scale, args.rounds = 0.01, args.rounds or 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(
            args.child, args.method, Path(args.store), args.scale, args.round, Path(args.out)
        )
    found = orchestrate(args)
    print(write_report(found, args.report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
