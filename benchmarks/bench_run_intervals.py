"""What adapting a run's intervals costs the service: the same requests with and without it.

In process (``Predictor``, the code path behind the HTTP routes), on ``models/default``
(LightGBM): a 4-stage pipeline's window of ``--window`` steps sliding over one synthetic run
(log-normal step times), asked ``/v1/forecast`` at horizons 1, 5 and 10 and ``/v1/recommend``
with the default policy. Two arms, interleaved in blocks (:func:`_ab.block_order`): ``own``
(no ``run_id``/``step``: the model's own intervals) and ``run`` (``run_id`` and the window's
step: :mod:`bubblecast.serve.run_intervals`). Each block sends ``--block`` requests, each one
step later than the last, and is timed as a whole; the overhead is the per-round paired ratio
``run / own`` (median and its 95% interval, and the ratio of the totals:
:func:`_ab.paired_summary`). Prints a table and writes ``benchmarks/results/run_intervals.json``.

    python benchmarks/bench_run_intervals.py [--rounds 20] [--block 40] [--window 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ab import block_order, paired_summary  # noqa: E402
from _results import run_header, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "run_intervals.json"
STAGES, LAYERS_PER_STAGE = 4, 4


def request(compute: np.ndarray, end: int, window: int, arm: str, route: str) -> dict[str, Any]:
    """The request for the window ending at step ``end`` (a recommend request with
    ``route == "recommend"``); ``arm == "run"`` names the run and the step."""
    ranks = [{"rank": s, "stage": s, "compute_s": compute[end - window + 1:end + 1, s].tolist()}
             for s in range(STAGES)]
    req: dict[str, Any] = {"pipeline": {"schedule": "1f1b", "stages": STAGES,
                                        "microbatches": 8},
                           "horizons": [1, 5, 10], "ranks": ranks}
    if route == "recommend":
        req.update(partition=[LAYERS_PER_STAGE] * STAGES,
                   layer_costs=[1.0] * (LAYERS_PER_STAGE * STAGES))
    if arm == "run":
        req.update(run_id="bench-run", step=end)
    return req


def timed_block(predictor: Any, route: str, arm: str, compute: np.ndarray, start: int,
                block: int, window: int) -> float:
    """Seconds for ``block`` requests of ``arm``, the windows ending at ``start`` onwards."""
    call = predictor.forecast_json if route == "forecast" else predictor.recommend
    bodies = [request(compute, start + i, window, arm, route) for i in range(block)]
    t0 = time.perf_counter()
    for body in bodies:
        call(body)
    return time.perf_counter() - t0


def measure(predictor: Any, route: str, rounds: int, block: int, window: int
            ) -> dict[str, Any]:
    """Per-request seconds of each arm and the paired overhead of ``run`` over ``own``."""
    steps = window + rounds * block + 1
    compute = np.exp(np.random.default_rng(0).normal(0.0, 0.2, (steps, STAGES)))
    totals: dict[str, list[float]] = {"own": [], "run": []}
    for arm in ("own", "run"):  # warm-up: caches, and the run's state past its first steps
        timed_block(predictor, route, arm, compute, window - 1, min(block, 8), window)
    for r in range(rounds):
        start = window - 1 + r * block  # both arms see the same windows in a round
        for arm in block_order(r, ["own", "run"]):
            totals[arm].append(timed_block(predictor, route, arm, compute, start, block,
                                           window))
    per = {arm: float(np.median(v)) / block for arm, v in totals.items()}
    return {"own_s": per["own"], "run_s": per["run"],
            "overhead": paired_summary(totals["run"], totals["own"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=40)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    from bubblecast.serve.predictor import Predictor

    predictor = Predictor.from_source(str(ROOT / "models" / "default"))
    t0 = time.perf_counter()
    out = {route: measure(predictor, route, args.rounds, args.block, args.window)
           for route in ("forecast", "recommend")}
    print(f"{'route':10} {'own':>10} {'run':>10} {'overhead (median, 95% CI)':>30}")
    for route, m in out.items():
        o = m["overhead"]
        print(f"{route:10} {m['own_s'] * 1e3:8.3f}ms {m['run_s'] * 1e3:8.3f}ms "
              f"{o['median_pct']:+8.2f}% [{o['ci95_pct'][0]:+.2f}, {o['ci95_pct'][1]:+.2f}]")
    doc = {**run_header("run_intervals", rounds=args.rounds, block=args.block,
                        window=args.window, stages=STAGES, model="models/default"),
           **{f"{route}_{k}": v for route, m in out.items()
              for k, v in (("own_ms", 1e3 * m["own_s"]), ("run_ms", 1e3 * m["run_s"]),
                           ("overhead_median_pct", m["overhead"]["median_pct"]),
                           ("overhead_total_pct", m["overhead"]["total_pct"]))},
           "results": out, "wall_s": time.perf_counter() - t0}
    write_json(args.out, doc)


if __name__ == "__main__":
    main()
