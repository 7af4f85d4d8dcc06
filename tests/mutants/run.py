"""Plant each bug of ``plants.py`` in turn, run the tests named for it, and report.

    python -m tests.mutants.run [--only WORD] [--report tests/README.md]

A plant is "caught" when its tests fail and "SURVIVED" when they pass. The source file is put
back after each plant (also on Ctrl-C). Exit status 1 when any plant survived.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from .plants import PLANTS, Plant

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- planted bugs: begin -->"
END = "<!-- planted bugs: end -->"


def run_plant(plant: Plant) -> tuple[bool, float, str]:
    path = ROOT / plant.module
    original = path.read_text()
    path.write_text(plant.apply(original))
    started = time.monotonic()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-x",
                "-q",
                "--color=no",
                "-p",
                "no:cacheprovider",
                *plant.tests,
            ],
            cwd=ROOT,
            env={**os.environ, "JUPYTER_PAUSE_ALLOW_SKIPS": "0"},
            capture_output=True,
            text=True,
        )
    finally:
        path.write_text(original)
    return done.returncode != 0, time.monotonic() - started, first_failure(done.stdout)


def first_failure(output: str) -> str:
    """The first assertion (``E ...`` line) pytest printed: how the plant was caught."""
    for line in output.splitlines():
        if line.startswith("E ") and line[1:].strip():
            text = " ".join(line[1:].split())
            return text if len(text) <= 90 else text[:87] + "..."
    return ""


def table(rows: list[tuple[Plant, bool, float, str]]) -> str:
    lines = [
        "| promise | planted bug | where | caught by | result | how | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for plant, caught, seconds, how in rows:
        tests = ", ".join(f"`{t.split('/')[-1]}`" for t in plant.tests)
        lines.append(
            f"| {plant.promise} | {plant.bug} | `{plant.module.split('/')[-1]}` | {tests} "
            f"| {'caught' if caught else '**SURVIVED**'} | {how.replace('|', '/')} "
            f"| {seconds:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="plants whose bug or module contains this word")
    parser.add_argument("--report", type=Path, help="replace the table in this markdown file")
    args = parser.parse_args()
    plants = [p for p in PLANTS if not args.only or args.only in p.bug or args.only in p.module]
    rows = []
    for number, plant in enumerate(plants, 1):
        print(f"[{number}/{len(plants)}] {plant.module}: {plant.bug} ...", end=" ", flush=True)
        caught, seconds, how = run_plant(plant)
        print(f"{'caught' if caught else 'SURVIVED'} ({seconds:.0f} s) {how}", flush=True)
        rows.append((plant, caught, seconds, how))
    report = table(rows)
    print(report)
    if args.report:
        text = args.report.read_text()
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        args.report.write_text(f"{head}{BEGIN}\n{report}\n{END}{tail}")
    return 0 if all(row[1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
