"""Adaptive conformal inference per decision: this tree's ``AdaptiveConformal`` against the one
of an earlier revision, A/B in one process.

The policy layer (``ModelSpeeds``: ``policy-eval --model``, the live controller) and the
prediction service (a request naming its run) call :meth:`AdaptiveConformal.observe` and
:meth:`AdaptiveConformal.adjust` once per decision. This times both calls together per
decision over a run of ``--decisions`` origins (4 ranks, a trailing 64-step window, the
served ACI settings), for the shipped model's horizons (1, 5, 10), the decisions benchmark's
(1-100, six) and every horizon 1-100, with the class of ``--base`` (read from git, run from
its source) and this tree's, in ``--rounds`` interleaved rounds. It also checks that both give
the same answers, bit for bit. Prints a table; writes ``benchmarks/results/aci.json``.

    python benchmarks/bench_aci.py [--base 18f02f4] [--decisions 1500] [--rounds 9]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import run_header, write_json  # noqa: E402

from bubblecast.forecast.conformal import AdaptiveConformal  # noqa: E402
from bubblecast.policy.speeds import SERVED_ACI  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "aci.json"
HORIZON_SETS = {"shipped model (3)": [1, 5, 10], "decisions (6)": [1, 5, 10, 25, 50, 100],
                "every 1-100 (100)": list(range(1, 101))}
RANKS, WINDOW = 4, 64


def base_class(rev: str) -> type:
    """``AdaptiveConformal`` as revision ``rev`` defined it."""
    source = subprocess.run(["git", "show", f"{rev}:bubblecast/forecast/conformal.py"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    module = types.ModuleType(f"conformal_{rev}")
    exec(compile(source, f"{rev}:conformal.py", "exec"), module.__dict__)  # noqa: S102
    return module.AdaptiveConformal


def one_run(cls: type, horizons: list[int], decisions: int) -> tuple[float, list[bytes]]:
    """Mean seconds of observe + adjust per decision, and every answer's bytes."""
    aci = cls(**SERVED_ACI)
    rng = np.random.default_rng(0)
    hist = rng.lognormal(0.0, 0.1, (decisions + 1, RANKS))
    qs = np.sort(rng.lognormal(0.0, 0.1, (decisions, len(horizons), RANKS, 3)), axis=3)
    answers, total = [], 0.0
    for t in range(decisions):
        seen = hist[max(0, t - WINDOW + 1): t + 1]
        start = time.perf_counter()
        aci.observe(seen, t)
        out = aci.adjust(qs[t], horizons, t)
        total += time.perf_counter() - start
        answers.append(out.tobytes())
    return total / decisions, answers


def measure(base: type, decisions: int, rounds: int) -> dict[str, Any]:
    out = {}
    for name, horizons in HORIZON_SETS.items():
        times: dict[str, list[float]] = {"base": [], "tree": []}
        same = True
        for _ in range(rounds):
            tb, ab = one_run(base, horizons, decisions)
            tt, at = one_run(AdaptiveConformal, horizons, decisions)
            times["base"].append(tb)
            times["tree"].append(tt)
            same = same and ab == at
        b, t = float(np.median(times["base"])), float(np.median(times["tree"]))
        out[name] = {"horizons": len(horizons), "base_us": b * 1e6, "tree_us": t * 1e6,
                     "ratio": t / b, "same_answers": same,
                     "rounds_base_us": [x * 1e6 for x in times["base"]],
                     "rounds_tree_us": [x * 1e6 for x in times["tree"]]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="18f02f4", help="git revision to compare against")
    ap.add_argument("--decisions", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.decisions < 1 or args.rounds < 1:
        ap.error("--decisions and --rounds must be positive")
    try:
        base = base_class(args.base)
    except (subprocess.CalledProcessError, OSError) as exc:
        stderr = getattr(exc, "stderr", None)
        sys.exit(f"bench_aci: cannot read revision {args.base!r} from git: "
                 f"{stderr.strip().splitlines()[-1] if stderr else exc}")
    results = measure(base, args.decisions, args.rounds)
    print(f"{'horizons':20} {args.base:>10} {'this tree':>10} {'ratio':>6}  same answers")
    for name, r in results.items():
        print(f"{name:20} {r['base_us']:8.0f}us {r['tree_us']:8.0f}us {r['ratio']:6.2f}  "
              f"{'yes' if r['same_answers'] else 'NO'}")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip() or "unknown"
    doc = run_header("aci", base=args.base, tree_head=head, decisions=args.decisions,
                     rounds=args.rounds,
                     ranks=RANKS, window=WINDOW, served_aci=dict(SERVED_ACI))
    doc.update({f"{name} {k}": r[k] for name, r in results.items()
                for k in ("base_us", "tree_us", "ratio", "same_answers")})
    write_json(args.out, {**doc, "results": results})
    if not all(r["same_answers"] for r in results.values()):
        sys.exit("bench_aci: the two implementations gave different answers")


if __name__ == "__main__":
    main()
