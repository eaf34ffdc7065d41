"""Memory/bubble trade-off of every simulated schedule at the zero-bubble paper's Table-5
setting (P=8, M=24, f=18.522, b=18.086, w=9.337, comm=0.601 ms).

For each schedule :func:`bubblecast.sim.simulator.simulate_events` simulates one step (the
``bubblecast simulate`` path) and :mod:`bubblecast.sim.accounting` gives its bubble fraction
and steady bubble fraction (the ``inspect --json`` path, SPEC §2); the peak in-flight
activations per rank come from the op order (:mod:`bubblecast.sim.memory`). Multi-chunk
looped schedules run 3 chunks per rank (the paper's interleaved setting), V-shape ones 2.
Prints a Markdown table (the README's) and writes ``benchmarks/results/schedules.json``.
Usage: ``python benchmarks/bench_schedules.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._results import run_header, write_json  # noqa: E402
from bubblecast.sim.accounting import (  # noqa: E402
    bubble_fraction,
    rank_step_table,
    steady_bubble_fraction,
)
from bubblecast.sim.memory import peak_activations  # noqa: E402
from bubblecast.sim.schedules import SCHEDULES, SIMULABLE, build_schedule  # noqa: E402
from bubblecast.sim.simulator import SimConfig, simulate_events  # noqa: E402

TABLE5 = {"stages": 8, "microbatches": 24, "f": 18.522, "b": 18.086, "w": 9.337,
          "comm": 0.601}
#: The paper's Table 5 figures where it prints one (bubble rate).
PAPER = {"1f1b": 0.2431, "zb-h1": 0.1585, "interleaved": 0.1055}


def chunks_of(name: str) -> int:
    """Chunks per rank each schedule runs at in the table."""
    spec = SCHEDULES[name]
    if not spec.multi_chunk:
        return 1
    return 2 if spec.style == "v" else 3


def row(name: str) -> dict:
    v = chunks_of(name)
    config = SimConfig(schedule=name, chunks=v, **TABLE5)
    table = rank_step_table(simulate_events(config).frame)
    peaks = peak_activations(build_schedule(name, TABLE5["stages"], TABLE5["microbatches"], v))
    return {"schedule": name, "chunks": v, "bubble_fraction": bubble_fraction(table),
            "steady_bubble_fraction": steady_bubble_fraction(table),
            "peak_activations_max": float(peaks.max()),
            "peak_activations_rank0": float(peaks[0]),
            "peak_activations_per_rank": peaks.tolist(), "paper": PAPER.get(name)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                             "schedules.json"))
    args = parser.parse_args()
    rows = [row(name) for name in SIMULABLE]
    print("| schedule | chunks | bubble fraction | steady bubble fraction | peak activations "
          "(max over ranks, microbatches) | paper |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        paper = "—" if r["paper"] is None else f"{r['paper']:.4f}"
        print(f"| {r['schedule']} | {r['chunks']} | {r['bubble_fraction']:.4f} | "
              f"{r['steady_bubble_fraction']:.4f} | {r['peak_activations_max']:.2f} | {paper} |")
    write_json(args.out, {**run_header("schedules", setting=TABLE5), "rows": rows})


if __name__ == "__main__":
    main()
