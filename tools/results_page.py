"""Write the results page, docs/results.md, from benchmarks/results/*.json.

Every number on the page is read from a JSON file a benchmark wrote; nothing is typed by hand.
One section per benchmark (the JSON's ``benchmark`` key, else the file name: ``bench_fleet-500``
-> ``fleet``), one subsection per file with its command, machine, date (when the file has
them) and a table of its headline numbers. Known benchmarks have their own table below
(``RENDERERS``); any other file gets the generic table of its top-level scalar keys, so a new
benchmark appears without a change here. A renderer that no longer fits its file (a benchmark
changed its JSON) falls back to the generic table and says so.

The same run rewrites the "Headline figures" table in README.md between the markers
``<!-- headline:start -->`` and ``<!-- headline:end -->`` (left alone when README lacks them).
What the figures mean, caveats and goals: docs/results-notes.md (hand-written, no generated
numbers); each section links its notes.

    python tools/results_page.py          # rewrite docs/results.md (atomically), README's table
    python tools/results_page.py --check  # exit 1 if either is stale (tests/test_results_page.py)

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
NOTES = "results-notes.md"  # beside the page
SPLIT = "\\|"  # a 7|5 split inside a table cell
HEAD_START, HEAD_END = "<!-- headline:start -->", "<!-- headline:end -->"

#: Keys of the common header (benchmarks/_results.py) and other run facts: shown above the
#: table, never in it.
HEADER_KEYS = ("benchmark", "machine", "cpus", "command", "python", "numpy", "date", "started",
               "timestamp", "code")
DATE_KEYS = ("date", "started", "timestamp")

#: Files written before benchmarks/_results.py's header existed record no command; these are
#: the commands the README gave for them (text, not figures). A file missing here and in its
#: JSON shows "not recorded".
DOCUMENTED_COMMANDS = {
    "engine.json": "python benchmarks/bench_engine.py --repeat 7",
    "dataset-m16.json": "python benchmarks/bench_dataset.py",
    "dataset-m2.json": "python benchmarks/bench_dataset.py --microbatches 2",
    "forecast.json": "python benchmarks/bench_forecast.py",
    "bench_policy.json": "python benchmarks/bench_policy.py --steps 400 --seeds 3 "
                         "--sensitivity '' --ramps ''",
    "solver.json": "python benchmarks/bench_solver.py --repeats 100",
    "bench_serve.json": "python benchmarks/bench_serve.py",
    "bench_serve-2301.json": "python benchmarks/bench_serve.py",
    "bench_serve-2338.json": "python benchmarks/bench_serve.py",
    "bench_fleet.json": "python benchmarks/bench_fleet.py --runs 100 --steps 200",
    "bench_fleet-500.json": "python benchmarks/bench_fleet.py --runs 500 --repeat 3 --no-train "
                            "--out benchmarks/results/bench_fleet-500.json",
    "bench_fleet-2000.json": "python benchmarks/bench_fleet.py --runs 2000 --repeat 2 "
                             "--no-train --out benchmarks/results/bench_fleet-2000.json",
    "bench_fleet-2000x800.json": "python benchmarks/bench_fleet.py --runs 2000 --steps 800 "
                                 "--repeat 1 --no-train",
}

#: What each benchmark measures (words only) and the heading of its notes in results-notes.md.
ABOUT = {
    "schedules": ("Bubble fraction and peak activations of every simulable schedule at one "
                  "setting, as `bubblecast simulate` + `inspect --json` compute them.",
                  "Schedules"),
    "engine": ("The vectorised timing engine against the plain event-loop reference, and "
               "`simulate_events` at the same size.", "Speed and memory"),
    "write": ("`write_events` against a plain pyarrow write of the same frame, and `simulate` "
              "end to end (in process and as the command).", "Speed and memory"),
    "load": ("Loading and validating about 10M events.", "Speed and memory"),
    "dataset": ("`bubblecast dataset` on simulated events: feature rows, wall time, peak "
                "memory.", "Speed and memory"),
    "solver": ("The exact contiguous partition solver.", "Speed and memory"),
    "record": ("`bubblecast.record` overhead, direct A/B against the same pipeline bare.",
               "Recording overhead"),
    "migration": ("Live layer migration between two gloo ranks (Adam state moves with the "
                  "layers).", "Speed and memory"),
    "forecast": ("Forecasters on held-out simulated runs: skill against the best baseline and "
                 "p10-p90 coverage per horizon.", "Forecasting"),
    "calibration": ("p10-p90 coverage of LightGBM and the GRU on runs of new seeds, per "
                    "training mix, horizon and scenario: the models' own intervals and as the "
                    "policy layer serves them (adaptive conformal).", "Forecasting"),
    "calibration_bound": ("How often a static p10-p90 interval can read in band on new runs: "
                          "the model's own calibration refitted on resampled calibration and "
                          "test runs, and by oracle groups (each scenario on its own runs).",
                          "Forecasting"),
    "policy": ("Policies replayed offline on held-out simulated runs, migrations paid: mean "
               "gain against static per scenario.", "Policies offline"),
    "guard": ("The forecast guard with the shipped model, the trend forecaster and a "
              "deliberately wrong model.", "The guard with any model"),
    "serve": ("The prediction service against `mlflow models serve` under open-loop load.",
              "Serving"),
    "live": ("The live closed loop on a real 2-stage CPU pipeline with an emulated slowdown.",
             "Live closed loop"),
    "fleet": ("`dataset` (and LightGBM training) over a fleet of runs, in process and on a "
              "local Dask cluster.", "Fleet"),
    "read": ("`read_events` and `bubblecast dataset` on 10.24M events, this code against an "
             "older one.", "Reading"),
    "device_check": ("The recorder's device timing and the Kineto importer on a real GPU (an "
                     "H200 lent for one session).", "On a GPU"),
    "peers": ("bubblecast beside its peers on the same work: features against mlforecast, "
              "`whatif` and `simulate` end to end against bare imports.", None),
    "decisions": ("Predictive driven by a trained LightGBM against the trend forecaster: oracle "
                  "share per scenario family.", "Decisions: LightGBM against the trend"),
    "decision_forecasts": ("The forecasts behind those decisions: served p10-p90 coverage and the "
                           "log error of the median and of the planning speed, per horizon the "
                           "policy plans over, LightGBM and the trend on the same origins.",
                           "Decisions: LightGBM against the trend"),
    "live_balance": ("Planning each step's packed documents live on a real CPU pipeline "
                     "(the packed GPT): static, tokens and balance interleaved in one launch; "
                     "documents only, and one slow replica.", "Work balancing, live"),
    "balance": ("Planning each step's packed documents (packing, order, micro-batches per "
                "replica) on simulated runs: static, token balancing, the learned cost model "
                "and the oracle; a slow replica; outlier delay; decision time.",
                "Work balancing"),
    "plan_worker": ("Where the live planner runs: the same `balance` plan computed on a thread "
                    "of the training process and in a worker process, A/B against no planning "
                    "on the packed GPT's steps.", "Live planner: thread or process"),
    "decision_thread": ("Where rank 0 decides: in its decision process or on its decision "
                        "thread while the step trains, or inline on the training thread, A/B "
                        "against no controller on the same trainer.", "Where rank 0 decides"),
    "plan_costs": ("The same steps' plans timed by their measured micro-batch costs (each run "
                   "in isolation on the real stages, composed by the engine) and by the learned "
                   "cost model.", "Plans: measured costs against the cost model"),
    "host_allocator": ("The host allocator A/B: the same packed steps, by the loader's packing "
                       "and by token balancing, with a gloo rank's allocator and with glibc's "
                       "own thresholds: seconds and page faults a step.",
                       "The host allocator"),
    "run_intervals": ("What adapting a run's intervals across requests costs the service: "
                      "the same `/v1/forecast` and `/v1/recommend` requests with and without "
                      "`run_id` and `step`, in process, A/B.", "Serving"),
    "aci": ("Adaptive conformal inference per decision (observe + adjust), this tree against "
            "an earlier revision, A/B in one process, with a bit-for-bit check of the answers.",
            "Forecasting"),
    "host_interference": ("What slows a rank's compute on this host: a second process "
                          "computing beside it, or gloo transfers on the computing cores.",
                          "Work balancing, live"),
}

#: Order of the sections; benchmarks not listed follow, sorted by name.
ORDER = ("schedules", "engine", "write", "load", "dataset", "solver", "migration", "record",
         "forecast", "calibration", "calibration_bound", "aci", "policy", "guard", "decisions",
         "decision_forecasts", "balance",
         "live_balance", "plan_costs", "host_allocator", "host_interference", "plan_worker",
         "serve", "run_intervals", "live", "decision_thread", "fleet", "read")


@dataclass(frozen=True)
class Result:
    """One JSON file of benchmarks/results."""

    path: Path
    name: str
    doc: Any


# ---------------------------------------------------------------------------------------------
# reading


def benchmark_name(path: Path, doc: Any) -> str:
    """The JSON's ``benchmark`` key, else the file stem without ``bench_`` and a ``-suffix``."""
    if isinstance(doc, dict) and isinstance(doc.get("benchmark"), str) and doc["benchmark"]:
        return doc["benchmark"]
    stem = path.stem.removeprefix("bench_")
    return stem.split("-", 1)[0] or stem


def load_results(results: Path) -> list[Result]:
    """Every ``*.json`` in ``results``: files without a ``-suffix`` first, then by name (so
    ``bench_serve.json`` comes before ``bench_serve-2301.json``); unreadable files stop the run."""
    out = []
    for path in sorted(results.glob("*.json"), key=lambda p: ("-" in p.stem, p.name)):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"results_page: cannot read {path}: {exc}") from exc
        out.append(Result(path, benchmark_name(path, doc), doc))
    return out


def section_order(results: Iterable[Result]) -> list[str]:
    names = {r.name for r in results}
    return [n for n in ORDER if n in names] + sorted(names - set(ORDER))


# ---------------------------------------------------------------------------------------------
# formatting


def fmt(value: Any, spec: str | None = None) -> str:
    """A cell: ``None`` is a dash, booleans yes/no, ints with thousands separators, floats by
    ``spec`` (default: 4 significant digits, no exponent above 10,000)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if spec is None else format(value, spec)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if spec is not None:
            return format(value, spec)
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    if isinstance(value, list) and all(isinstance(v, int | float) for v in value):
        return ", ".join(fmt(v, spec) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def pct(value: Any, digits: int = 2) -> str:
    """A fraction as a signed percentage: 0.0117 -> +1.17%."""
    return "—" if value is None else f"{value * 100:+.{digits}f}%"


def spread(values: Iterable[float], spec: str) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    lo, hi = min(vals), max(vals)
    return format(lo, spec) if lo == hi else f"{format(lo, spec)}-{format(hi, spec)}"


def table(headers: list[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in row) + " |"
              for row in rows]
    return lines + [""]


def fact(value: Any) -> str:
    """A value in running text: floats to 6 significant digits, whole ones as integers."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{int(value):,}" if value.is_integer() else f"{value:.6g}"
    if isinstance(value, list):
        return ", ".join(fact(v) for v in value)
    return value if isinstance(value, str) else fmt(value)


def facts(pairs: Iterable[tuple[str, Any]]) -> str:
    """``key value; key value`` for the values that are present."""
    return "; ".join(f"{k} {fact(v)}" for k, v in pairs if v is not None)


def num(value: float | None) -> str:
    """Three significant digits without an exponent: 0.514, 5.56, 99.4, 3,111."""
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc (mkdocs) and GitHub give a plain-text heading."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", text)


# ---------------------------------------------------------------------------------------------
# the generic table and the per-benchmark ones


def generic(doc: Any) -> list[str]:
    """The top-level scalar keys (header keys aside), one row each."""
    if not isinstance(doc, dict):
        return [f"A JSON {type(doc).__name__}, not an object: see the file.", ""]
    rows = [(f"`{k}`", fmt(v)) for k, v in doc.items()
            if k not in HEADER_KEYS and (v is None or isinstance(v, str | int | float))]
    if not rows:
        return ["No top-level scalar values: see the file.", ""]
    return table(["key", "value"], rows)


def r_schedules(doc: dict) -> list[str]:
    lines = [f"Setting: {facts(doc['setting'].items())}.", ""]
    rows = [(r["schedule"], r["chunks"], fmt(r["bubble_fraction"], ".4f"),
             fmt(r["steady_bubble_fraction"], ".4f"), fmt(r["peak_activations_max"], ".2f"),
             fmt(r.get("paper"), ".4f")) for r in doc["rows"]]
    return lines + table(["schedule", "chunks", "bubble fraction", "steady bubble fraction",
                          "peak activations (microbatches, worst rank)", "paper"], rows)


def r_engine(doc: dict) -> list[str]:
    lines = [f"Timing: {doc['timing']}.", ""]
    rows = []
    for r in doc["engine"]:
        alt = r.get("alternating", {})
        sp = alt.get("per_round_spread", {})
        rows.append((r["schedule"], r["chunks"], r["ops"],
                     fmt(r["engine_ops_per_s"] / 1e6, ".0f"),
                     fmt(r["engine_opmajor_ops_per_s"] / 1e6, ".0f"),
                     fmt(r["reference_ops_per_s"] / 1e6, ".2f"),
                     fmt(r["speedup"], ".0f") + "x", fmt(r["speedup_opmajor"], ".0f") + "x",
                     fmt(alt.get("speedup"), ".0f") + "x",
                     fmt(alt.get("speedup_opmajor"), ".0f") + "x",
                     spread(sp.get("speedup", []), ".0f") + " / "
                     + spread(sp.get("speedup_opmajor", []), ".0f")))
    lines += table(["schedule", "chunks", "ops", "engine M ops/s `(steps, ops)`",
                    "engine M ops/s op-major", "reference M ops/s", "speed-up",
                    "speed-up op-major", "alternating", "alternating op-major",
                    "per-round spread (C / op-major)"], rows)
    s = doc.get("simulate")
    if s:
        lines += [f"`simulate_events`, {s['steps']:,} steps x {s['stages']} stages x "
                  f"{s['microbatches']} microbatches: {s['events']:,} events in "
                  f"{s['simulate_s'] * 1e3:.1f} ms ({s['events_per_s'] / 1e6:.1f} M events/s), "
                  f"+ {s['write_s'] * 1e3:.0f} ms to write.", ""]
    cold = doc.get("cold_speedup_min")
    if cold:
        lines += [f"Lowest speed-up over the schedules with cold caches (alternating): "
                  f"op-major {cold['opmajor']:.0f}x, `(steps, ops)` {cold['c_order']:.0f}x.", ""]
    return lines


def r_write(doc: dict) -> list[str]:
    lines = [f"Timing: {doc.get('timing', '—')}; load average {fmt(doc.get('load_average'))}.",
             ""]
    rows = [(w["events"], fmt(w["write_events_s"], ".3f"), fmt(w["write_events_cpu_s"], ".3f"),
             fmt(w["write_events_rows_per_s"] / 1e6, ".1f"),
             fmt(w["ratio_wall"], ".2f") + "x (" + spread(w["ratio_wall_range"], ".2f") + ")",
             fmt(w["file_mb"]["write_events"], ".1f"), fmt(w["file_mb"]["plain"], ".1f"))
            for w in doc["writes"]]
    lines += table(["events", "`write_events` s", "CPU s", "M rows/s",
                    "time vs plain `write_table` (per round)", "MB", "plain MB"], rows)
    rows = [(s["events"], fmt(s["in_process_s"], ".3f"),
             fmt(s["in_process_events_per_s"] / 1e6, ".1f"), fmt(s["command_s"], ".3f"),
             fmt(s["command_events_per_s"] / 1e6, ".1f"), f"`{s['command']}`")
            for s in doc.get("simulate", [])]
    if rows:
        lines += table(["events", "`simulate` in process s", "M events/s", "as the command s",
                        "M events/s", "command"], rows)
    return lines


def r_load(doc: dict) -> list[str]:
    tgt = doc.get("target", {})
    rows = [(doc["rows"], fmt(doc["file_mb"], ".1f"),
             f"{doc['load_s_median']:.2f} (median of {doc['repeats']})",
             fmt(doc.get("load_cpu_s_median"), ".2f"), fmt(doc["peak_rss_gb"], ".2f"),
             facts(tgt.items()), fmt(doc.get("meets_target")))]
    lines = table(["events", "file MB", "load + validate s", "CPU s", "peak RSS GB", "target",
                   "met"], rows)
    ph = doc.get("phases_s")
    return lines + ([f"Phases (s): {facts(ph.items())}.", ""] if ph else [])


def r_dataset(doc: dict) -> list[str]:
    tot = doc["timings"]["total"]
    rows = [(doc["events"], fmt(doc.get("microbatches")), doc["feature_rows"],
             doc["feature_columns"], fmt(tot["wall_s"], ".1f"), fmt(tot["cpu_s"], ".1f"),
             fmt(doc["peak_rss_gb"], ".2f"), facts(doc.get("targets", {}).items()))]
    return table(["events", "microbatches", "feature rows", "columns", "wall s", "CPU s",
                  "peak RSS GB", "targets"], rows)


def r_solver(doc: dict) -> list[str]:
    rows = [(r["layers"], r["stages"], fmt(r["solve_ms"], ".2f"), fmt(r["solve_moves_ms"], ".2f"),
             fmt(r["solve_memory_cap_ms"], ".2f"), fmt(r["min_bottleneck_ms"], ".2f"),
             fmt(r["candidates_ms"], ".2f")) for r in doc["rows"]]
    lines = [f"Median of {doc['repeats']} repeats.", ""]
    lines += table(["layers", "stages", "solve ms", "with moves ms", "with memory cap ms",
                    "min bottleneck ms", "candidates ms"], rows)
    t = doc.get("target")
    if t:
        lines += [f"Target: L={t['case'][0]}, P={t['case'][1]} in at most {t['limit_ms']} ms: "
                  f"{t['solve_ms']:.2f} ms, met: {fmt(t['pass'])}.", ""]
    return lines


def _ci(value: float, ci: list[float]) -> str:
    return f"{value:+.2f}% ({ci[0]:+.2f}..{ci[1]:+.2f})"


def _ab(d: dict) -> tuple[str, str]:
    return _ci(d["median_pct"], d["ci95_pct"]), _ci(d["total_pct"], d["total_ci95_pct"])


def _record_rows(label: str, summary: dict) -> list[tuple[Any, ...]]:
    rows = []
    for arm, a in summary["arms"].items():
        rows.append((label, arm, fmt(summary["step_ms_bare"], ".1f"), *_ab(a["wall"]),
                     *_ab(a["cpu"]), fmt(a.get("part_cpu_ms_median"), ".1f")))
    return rows


def r_record(doc: dict) -> list[str]:
    lines = [facts([("model", doc.get("model")), ("rounds", doc.get("rounds")),
                    ("warm-up rounds dropped", doc.get("warmup_rounds")),
                    ("block", doc.get("block")), ("code", doc.get("code"))]) + ".", ""]
    runs = doc.get("runs") or [{"summary": doc["summary"]}]
    rows = []
    for i, run in enumerate(runs, 1):
        rows += _record_rows(f"run {i}" if len(runs) > 1 else "this run", run["summary"])
    lines += table(["run", "arm", "bare step ms", "wall: median of rounds (95% CI)",
                    "wall: ratio of totals (95% CI)", "CPU: median (95% CI)",
                    "CPU: totals (95% CI)", "writer CPU ms per part"], rows)
    m = doc.get("mean_over_runs")
    if m:
        lines += [f"Mean over the runs: wall median {m['wall_median_pct']:+.2f}%, CPU median "
                  f"{m['cpu_median_pct']:+.2f}%; totals: wall {m['wall_total_pct']:+.2f}%, CPU "
                  f"{m['cpu_total_pct']:+.2f}%.", ""]
    if doc.get("verdict"):
        lines += [f"Verdict recorded with the run: {fmt(doc['verdict'])}.", ""]
    return lines


def r_decision_thread(doc: dict) -> list[str]:
    s = doc["summary"]
    lines = [facts([("model", doc.get("model")), ("decisions every", doc.get("every")),
                    ("rounds", doc.get("rounds")), ("block", doc.get("block")),
                    ("forecaster", s.get("forecaster"))]) + ".", ""]
    rows = [(key.replace("_vs_", " against "),
             f"{s[key]['median_pct']:+.2f}% ({s[key]['ci95_pct'][0]:+.2f}.."
             f"{s[key]['ci95_pct'][1]:+.2f})",
             f"{s[key]['total_pct']:+.2f}% ({s[key]['total_ci95_pct'][0]:+.2f}.."
             f"{s[key]['total_ci95_pct'][1]:+.2f})")
            for key in s if "_vs_" in key]
    lines += table(["step time", "median of rounds (95% CI)", "ratio of totals (95% CI)"],
                   rows)
    median = facts((k, fmt(v, ".2f") + " ms") for k, v in s["decision_ms_median"].items())
    lines += [f"Median step: {facts((k, fmt(v, '.2f') + ' ms') for k, v in s['step_ms'].items())}"
              f"; {s['decisions']} decisions, median {median}, "
              f"{s['decisions_failed']} failed or late; layer moves {len(s['moves'])}.", ""]
    return lines


def r_migration(doc: dict) -> list[str]:
    s = doc["summary"]
    rows = [(fmt(s["seconds_per_mb"] * 1e3, ".1f"), fmt(s["fixed_seconds"] * 1e3, ".0f"),
             fmt(s["mb_per_second"], ".0f"), fmt(s["median_seconds_per_mb"] * 1e3, ".1f"),
             fmt(s["median_first_step_extra_s"] * 1e3, ".0f"), s["migrations"],
             fmt(s["all_ok"]))]
    return table(["fitted ms per MB", "fitted fixed ms", "MB/s", "median ms per MB",
                  "median first-step extra ms", "migrations", "all ok"], rows)


def _horizons(models: dict) -> list[str]:
    first = next(iter(models.values()))
    return sorted(first, key=lambda h: int(h.lstrip("h")))


def r_calibration_bound(doc: dict) -> list[str]:
    # the calibrations scored: each record's readings per test group (the model's own first)
    kinds = sorted(dict.fromkeys(k for r in doc["records"] for k, v in r.items()
                                 if isinstance(v, dict) and "all" in v),
                   key=lambda k: k != "fitted")
    cells: dict[tuple, dict[str, list[tuple[float, float, float]]]] = {}
    cal: dict[str, dict[str, Any]] = {}
    # each reading is one resample at one horizon
    horizons = doc["records"][0]["fitted"]["all"]["n"] // doc["resamples"]
    for r in doc["records"]:
        cal.setdefault(r["mix"], {}).update(r["calibration_runs"])
        for kind in kinds:
            for group, v in r.get(kind, {}).items():
                key = (r["model"], r["mix"], group, r["test_runs"])
                cells.setdefault(key, {}).setdefault(kind, []).append(
                    (v["in_band"], v["all_horizons_in_band"], v["sd"]))
    lines = ["Share of resampled readings in band / of test draws in band at every horizon "
             "(sd of the readings), mean over training seeds "
             f"{fact(doc['train_seeds'])}; {fact(doc['resamples'])} resamples x "
             f"{horizons} horizons; "
             "calibration runs per kind: " + "; ".join(
                 f"{mix} " + ", ".join(f"{k} {fact(v)}" for k, v in c.items())
                 for mix, c in cal.items()) + ". `fitted` is the model's own shifts.", ""]
    rows = []
    for (model, mix, group, n_test), by in cells.items():
        rows.append((model, mix, group, n_test, *(
            " / ".join(f"{statistics.fmean(c[i] for c in by[k]):.2f}" for i in (0, 1))
            + f" ({statistics.fmean(c[2] for c in by[k]):.3f})"
            if k in by else "—" for k in kinds)))
    return lines + table(["model", "mix", "test group", "test runs", *kinds], rows)


def r_decision_forecasts(doc: dict) -> list[str]:
    shown = ("1", "16", "64", "128")
    lines = [f"Per cell: served p10-p90 coverage / log MAE of the p50 / log MAE of the planning "
             f"speed (risk {fact(doc['risk'])}); {fact(doc['test_runs'])} held-out runs per "
             f"family, origins every {fact(doc['every'])} steps; trained on "
             f"{fact(doc['train_runs'])} runs per family.", ""]
    rows = []
    for setup, families in doc["results"].items():
        for family, by_name in families.items():
            for name, by_h in by_name.items():
                rows.append((setup, family, name, *(
                    f"{c['coverage']:.2f} / {c['p50_log_mae']:.3f} / {c['plan_log_mae']:.3f}"
                    if (c := by_h.get(h)) else "—" for h in shown)))
    return lines + table(["setup", "family", "forecaster", *(f"h={h}" for h in shown)], rows)


def r_forecast(doc: dict) -> list[str]:
    a = doc.get("args", {})
    lines = [f"Arguments: {facts(a.items())}; rows: {facts(doc.get('rows', {}).items())}.", ""]
    ft = doc.get("fit_time", {})
    if ft:
        lines += ["Fit time: " + "; ".join(f"{m} {t['wall_s']:.0f} s wall" for m, t in
                                           ft.items()) + ".", ""]
    held = doc["held_out"]
    hs = _horizons(held["models"])
    rows = [(m, " / ".join(fmt(v[h]["skill"], ".3f") for h in hs),
             " / ".join(fmt(v[h]["coverage_80"], ".3f") for h in hs),
             " / ".join(fmt(v[h]["mae"], ".4f") for h in hs))
            for m, v in held["models"].items()]
    hl = " / ".join(hs)
    lines += [f"Held-out runs (best baseline: `{held['baseline']}`):", ""]
    lines += table(["model", f"skill {hl}", f"p10-p90 coverage {hl}", f"MAE {hl}"], rows)
    lines += _forecast_scenarios(doc.get("held_out_table", []))
    jit = doc.get("jitter")
    if jit:
        rows = [(m, " / ".join(fmt(v[h]["skill"], ".3f") for h in hs),
                 " / ".join(fmt(v[h]["coverage_80"], ".3f") for h in hs))
                for m, v in jit["models"].items() if m in ("lgbm", "seq")]
        lines += ["Jitter-only runs (a scenario absent from training):", ""]
        lines += table(["model", f"skill {hl}", f"coverage {hl}"], rows)
    bub = doc.get("bubbles")
    if bub:
        rows = [(b["model"], b["horizon"], fmt(b["predicted"], ".4f"), fmt(b["actual"], ".4f"),
                 fmt(b["mae"], ".4f")) for b in bub]
        lines += ["Bubble fraction at t+h, replayed with forecast against actual stage times:",
                  ""]
        lines += table(["model", "horizon", "predicted", "actual", "MAE"], rows)
    if doc.get("targets"):
        lines += [f"Targets: {facts(doc['targets'].items())}.", ""]
    return lines


def _forecast_scenarios(rows_in: list[dict]) -> list[str]:
    cells: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows_in:
        if r["model"] in ("lgbm", "seq") and r["scenario"] != "all":
            cells.setdefault((r["scenario"], r["model"]), {})[r["horizon"]] = r
    if not cells:
        return []
    rows = []
    for (sc, m), byh in sorted(cells.items()):
        hs = sorted(byh)
        rows.append((sc, m, " / ".join(fmt(byh[h]["skill"], ".3f") for h in hs),
                     " / ".join(fmt(byh[h]["coverage_80"], ".3f") for h in hs)))
    return ["By scenario (held-out runs; horizons in increasing order):", "",
            *table(["scenario", "model", "skill", "coverage"], rows)]


def _mean_gain(runs: dict, policy: str) -> float:
    return statistics.fmean(r["policies"][policy]["gain_vs_static"] for r in runs.values())


def r_policy(doc: dict) -> list[str]:
    setup = dict(doc.get("setup", {}))
    mig = setup.pop("migration", {})
    run = facts([("steps", doc.get("steps")), ("held-out runs per scenario", doc.get("seeds")),
                 ("wall s", doc.get("wall_s"))])
    lines = [f"Setup: {facts(setup.items())}; migration: {facts(mig.items())}; {run}.", ""]
    for name, fc in doc["forecasters"].items():
        scen = fc["scenarios"]
        label = next(iter(scen.values())).get("forecaster", name)
        lines += [f"Predictive with `{name}` ({fmt(label)}); mean gain against static over "
                  "the runs, positive = faster:", ""]
        rows = []
        for sc, v in scen.items():
            pol = v["policies"]
            rows.append((sc, fmt(pol["static"]["step_s"] * 1e3, ".1f"),
                         *(pct(_mean_gain(v["runs"], p)) for p in ("reactive", "predictive",
                                                                   "oracle")),
                         f"{pol['predictive']['actions']} / {pol['oracle']['actions']}"))
        lines += table(["scenario", "static step ms", "reactive", "predictive", "oracle",
                        "moves predictive / oracle"], rows)
        lines += _policy_checks(fc["checks"])
    return lines


def _policy_checks(c: dict) -> list[str]:
    rows = []
    if "oracle_share_mean" in c:
        o = c["oracle_share_mean"]
        rows.append(("share of the oracle's gain, plain mean of runs", pct(o["value"], 1)[1:],
                     o["runs"], fmt(o["pass"])))
    if "oracle_share" in c:
        o = c["oracle_share"]
        rows.append(("share of the oracle's gain, gain-weighted", pct(o["value"], 1)[1:],
                     o["runs"], fmt(o["pass"])))
    if "losses_vs_static" in c:
        o = c["losses_vs_static"]
        rows.append(("runs slower than static by more than 0.5%", fmt(o.get("runs_over_0.5%")),
                     "", fmt(o["pass"])))
    if "stationary_worst_slowdown" in c:
        o = c["stationary_worst_slowdown"]
        rows.append(("worst slowdown on stationary runs", fmt(o["value"]), "", fmt(o["pass"])))
    return table(["check", "value", "runs", "passed"], rows) if rows else []


def r_guard(doc: dict) -> list[str]:
    run = facts([("steps", doc.get("steps")), ("model", doc.get("model")),
                 ("wall s", doc.get("wall_s")), ("bound %", doc.get("bound_pct"))])
    lines = [f"Setup: {facts((doc.get('setup') or {}).items())}; {run}.", ""]
    rows = [(name, fmt(s["mean_gain_pct"], "+.2f") + "%", fmt(s["worst_gain_pct"], "+.2f") + "%",
             s["runs_slower_than_bound"], fmt(s["max_moves_over_oracle"], ".0f") + "x",
             s["moves_where_oracle_idle"], s["runs"], fmt(s["met"]))
            for name, s in doc["summary"].items()]
    runs = doc.get("runs", [])
    for pol in ("reactive", "oracle"):
        if runs and f"{pol}_gain_pct" in runs[0]:
            mean = statistics.fmean(r[f"{pol}_gain_pct"] for r in runs)
            rows.append((pol, f"{mean:+.2f}%", "", "", "", "", len(runs), ""))
    return lines + table(["predictive with", "mean gain vs static", "worst run",
                          "runs slower than the bound", "most moves vs oracle",
                          "moves where the oracle makes none", "runs", "met"], rows)


def _mrange(d: dict) -> str:
    return f"{num(d['median'])} ({num(d['min'])}-{num(d['max'])})"


def r_serve(doc: dict) -> list[str]:
    m = doc.get("machine", {})
    lines = [facts([("load average at start", m.get("loadavg_at_start")),
                    ("at end", m.get("loadavg_at_end")), ("generator", m.get("generator"))])
             + ".", ""]
    if doc.get("args"):
        lines += [f"Arguments recorded: {facts(doc['args'].items())}.", ""]
    s = doc["summary"]
    rates = [k.split("@", 1)[1] for k in s if k.startswith("bubblecast@")]
    rows = []
    for rate in rates:
        row: list[str] = [rate]
        for server in ("bubblecast", "mlflow"):
            cell = s.get(f"{server}@{rate}")
            row += ([_mrange(cell["p50_ms"]), _mrange(cell["p99_ms"]),
                     _mrange(cell["achieved_rps"])] if cell else ["—"] * 3)
        rows.append(row)
    lines += ["Median (range) over the runs:", ""]
    lines += table(["offered req/s", "bubblecast p50 ms", "bubblecast p99 ms", "bubblecast req/s",
                    "mlflow p50 ms", "mlflow p99 ms", "mlflow req/s"], rows)
    goal_rate = str(doc.get("args", {}).get("goal_rate", "500")).split(".")[0]
    goal = s.get(f"bubblecast@{goal_rate}")
    if goal:
        lines += [f"bubblecast p99 at {goal_rate} req/s, run by run: "
                  + ", ".join(num(r["p99_ms"]) + " ms" for r in goal["runs"]) + ".", ""]
    if doc.get("capacity_speedup_per_pair"):
        lines += [f"Capacity against MLflow, pair by pair: "
                  f"{spread(doc['capacity_speedup_per_pair'], '.1f')}x.", ""]
    extra = [("goals", facts(doc.get("goals", {}).items()))]
    ip = doc.get("in_process")
    if ip:
        extra.append(("in-process forecast CPU ms", fmt(ip.get("cpu_mean_ms"), ".2f")))
    for kind, f in (doc.get("fail_open") or {}).items():
        extra.append((f"fail-open client, service {kind}",
                      f"{f['returned_none']} of {f['calls']} calls returned None, p99 "
                      f"{f['p99_ms']:.1f} ms"))
    g = doc.get("generator_check")
    if g:
        extra.append(("generator check p99 ms", f"wrk {g['wrk']['p99_ms']:.2f}, Python "
                                                 f"{g['python']['p99_ms']:.2f}"))
    return lines + table(["what", "value"], extra)


def r_live(doc: dict) -> list[str]:
    lines = [facts([("inject", f"`{doc.get('inject')}`"), ("model", doc.get("model")),
                    ("decisions every", doc.get("every")), ("wall s", doc.get("wall_s"))]) + ".",
             ""]
    rows = []
    for name, p in doc["policies"].items():
        moves = " ".join(SPLIT.join(map(str, a["to"])) + f"@{a['step']}" for a in p["actions"])
        rows.append((name, fmt(p["samples_s_slowed"], ".0f"), fmt(p["ratio_slowed"], ".3f"),
                     fmt(p["ratio_plateau"], ".3f"), fmt(p.get("first_response_step")),
                     moves or "—", fmt(p.get("decision_latency_ms"), ".1f"),
                     fmt(p.get("control_pct"), ".2f")))
    lines += table(["policy", "samples/s while slowed", "vs static", "vs static on the plateau",
                    "first move answering the fault", "moves (split@step)",
                    "decision ms", "control % of step"], rows)
    g = doc.get("goals")
    if g:
        lines += table(["goal", "value"], [(f"`{k}`", fmt(v)) for k, v in g.items()])
    o = doc.get("overhead")
    if o:
        lines += [f"Controller at `static`, with against without it: "
                  f"{o['overhead_pct_ab']:+.2f}% (A/B), {o['overhead_pct_direct']:+.2f}% "
                  "(time inside the controller).", ""]
    return lines


def r_fleet(doc: dict) -> list[str]:
    lines = [facts([("runs", doc.get("runs")), ("steps", doc.get("steps")),
                    ("events", doc.get("events")), ("feature rows", doc.get("feature_rows")),
                    ("workers", doc.get("workers")),
                    ("load average", doc.get("load_average", doc.get("load_average_before"))),
                    ("after", doc.get("load_average_after"))]) + ".", ""]
    ip, cl = doc["in_process"], doc["cluster"]
    rounds = doc.get("rounds", [])
    rows = [("in process: wall s, CPU s", f"{ip['wall_s']:.2f}, {ip['cpu_s']:.2f}"),
            ("cluster: wall s, CPU s (command + workers)", f"{cl['wall_s']:.2f}, "
                                                           f"{cl['cpu_s']:.2f}"),
            ("speed-up", fmt(doc["speedup"], ".2f") + "x"
             + (f" ({spread([r['speedup'] for r in rounds], '.2f')}x over {len(rounds)} rounds)"
                if len(rounds) > 1 else "")),
            ("speed-up with the cluster's start-up", fmt(doc.get("speedup_with_start"), ".2f")),
            ("cluster start-up s", fmt(doc.get("cluster_start_s"))),
            ("peak RSS in process MiB", fmt(ip.get("peak_mib"))),
            ("peak RSS per worker MiB (command)", f"{fmt(cl.get('worker_peak_mib'))} "
                                                  f"({fmt(cl.get('driver_peak_mib'))})"),
            ("same fingerprint", fmt(doc.get("same_fingerprint")))]
    lines += table(["`dataset`", "value"], rows)
    lg = doc.get("lgbm")
    if lg:
        rows = [(h, fmt(v["in_process"], ".3f"), fmt(v["dask"], ".3f"),
                 fmt(abs(v["in_process"] - v["dask"]), ".3f")) for h, v in lg["skill"].items()]
        lines += ["LightGBM held-out skill, in process against `lightgbm.dask`:", ""]
        lines += table(["horizon", "in process", "`lightgbm.dask`", "difference"], rows)
        lines += [f"Training wall s: {facts(lg.get('wall_s', {}).items())}.", ""]
    return lines


def r_read(doc: dict) -> list[str]:
    lines = [facts([("events", doc.get("events")), ("file MiB", doc.get("file_mib")),
                    ("rounds", doc.get("rounds")), ("baseline", doc.get("baseline")),
                    ("load average before", doc.get("load_average_before")),
                    ("after", doc.get("load_average_after"))]) + ".", ""]
    rows = [(what, fmt(v["wall_s"], ".2f"), fmt(v.get("cpu_s"), ".2f"), fmt(v["peak_gib"], ".2f"))
            for what, v in doc["summary"].items()]
    lines += table(["what", "wall s", "CPU s", "peak GiB"], rows)
    if doc.get("goals"):
        lines += [f"Goals: {facts(doc['goals'].items())}.", ""]
    imports = [r["import_s"] for r in doc.get("read_all", []) if "import_s" in r]
    if imports:
        lines += [f"Importing bubblecast in a fresh process: {spread(imports, '.2f')} s.", ""]
    return lines


def r_balance(doc: dict) -> list[str]:
    lines = [f"Setting: {facts(doc['setting'].items())}; scenario {doc['scenario']}; "
             f"{doc['runs']} runs of {doc['steps']} steps per regime (plain means).", ""]
    for key, part in doc["regimes"].items():
        cm = part["cost_model"]
        lines += [f"Regime ({key}) `{part['preset']}`: cost model {cm['learner']}, held-out "
                  f"p90 relative error {fmt(cm['heldout']['p90_rel_error'], '.4f')} (the per-op "
                  f"noise alone: {fmt(cm['heldout']['noise_floor_p90'], '.4f')}); coverage "
                  f"p10-p90 {fmt(cm['heldout']['coverage_p10_p90'], '.3f')}.", ""]
        rows = [(name, fmt(m["step_ms"], ".2f"), fmt(m["speedup"], ".3f") + "x",
                 fmt(m["oracle_share"], ".3f"), fmt(m["imbalance"], ".3f"),
                 fmt(m["decision_ms"], ".2f")) for name, m in part["mean"].items()]
        rows.append(("bound: every micro-batch at the step's mean",
                     fmt(part["mean"]["static"]["bound_ms"], ".2f"),
                     fmt(part["bound_speedup"], ".3f") + "x", "", "", ""))
        lines += table(["policy", "step ms", "speed-up vs static", "share of oracle's gain",
                        "imbalance degree", "plan ms"], rows)
        ahead = part["balance_ahead_of_tokens"]
        lines += [f"balance ahead of tokens: {pct(ahead['mean'])} (runs: "
                  + ", ".join(pct(x) for x in ahead["per_run"]) + ").", ""]
    rows = [(f"({k}) {p['preset']}", ", ".join(fmt(r["recovery"], ".3f") for r in p["runs"]),
             fmt(p["recovery_mean"], ".3f"), fmt(p["integer_counts_bound"], ".3f"))
            for k, p in doc["slow_replica"].items()]
    lines += ["One replica slowed (recovery of the slowdown after the onset against the "
              "speed-blind planner and the same documents without the fault):", ""]
    lines += table(["regime", "recovery per run", "mean", "integer counts alone, equal "
                    "micro-batches"], rows)
    rows = [(fmt(s["min_share"], ".2f"), s["max_wait"], fmt(s["speedup"], ".3f") + "x",
             fmt(s["delayed_token_delay_steps"], ".2f"), fmt(s["all_token_delay_steps"], "+.2f"))
            for s in doc["outlier_delay"]["settings"]]
    lines += [f"Outlier delay (opt-in), `{doc['outlier_delay']['preset']}`:", ""]
    lines += table(["outlier at (share of budget)", "max wait", "speed-up (tokens/s)",
                    "delay of delayed tokens (steps)", "delay over all tokens (steps)"], rows)
    d = doc["decision"]
    rows = [(label, fmt(d[label]["median_ms"], ".2f"), fmt(d[label]["p90_ms"], ".2f"))
            for label in ("equal speeds", "one replica 1.5x")]
    lines += [f"Decision time, `plan_batch` on {d['documents']:,} documents, {d['replicas']} "
              f"replicas x {d['microbatches']} micro-batches, {d['stages']} stages "
              f"({d['samples']} samples):", ""]
    return lines + table(["speeds", "median ms", "p90 ms"], rows)


def _documents_stretch(doc: dict) -> str:
    """The documents setting's stretch (``bench_live_balance --dilation``), when it had one."""
    factor = doc.get("documents_dilation", 1.0)
    return "" if factor == 1.0 else f"; documents: every rank's compute stretched {factor:g}x"


def r_live_balance(doc: dict) -> list[str]:
    models = "; ".join(f"{k}: {facts(v.items())}" for k, v in doc["models"].items())
    lines = [f"Packed GPT per setting ({models}); {doc['runs']} runs, each one launch with "
             f"the policies' trainers interleaved step by step (plain means over runs); "
             f"slow-replica: every rank's compute stretched {doc['dilation']:g}x by sleeping "
             f"(4 ranks on 2 cores), replica 1 a further {doc['factor']:g}x from step "
             f"{doc['scale']['onset']}{_documents_stretch(doc)}.", ""]
    for setting, s in doc["settings"].items():
        cm = s["cost_model_heldout"]
        noise = cm.get("noise")
        floor = (f"; no model can go below {fmt(noise['p90_floor'], '.3f')} there: the 80th "
                 f"percentile of the spread of {noise['pairs']} ops the run and its same-seed "
                 f"twin both ran") if noise else ""
        if noise and noise.get("insample_p90") is not None:
            floor += (f"; the same learner fitted on that run itself and scored there (a "
                      f"reference, not a bound): {fmt(noise['insample_p90'], '.3f')}")
        lines += [f"**{setting}** (cost model: {cm.get('learner')}, p90 relative error on a "
                  f"held-out live run {fmt(cm.get('p90_rel_error'), '.3f')}{floor})", ""]
        call = any(m.get("plan_call_ms") is not None for m in s["mean"].values())
        rows = [(n, fmt(m["samples_s"], ".1f"), fmt(m["ratio"], ".3f") + "x",
                 fmt(m["ratio_paired_median"], ".3f"), fmt(m["recovery"], ".2f"),
                 fmt(m["decision_ms"], ".2f"),
                 *((fmt(m.get("plan_call_ms"), ".2f"),) if call else ()))
                for n, m in s["mean"].items()]
        lines += table(["trainer", "documents/s", "vs static", "per-step median vs static",
                        "recovery", "plan ms", *(("plan call ms",) if call else ())], rows)
        off = s["offline_speedup"]
        lines += [f"balance vs static per run: {fmt(s['balance_ratio_per_run'], '.3f')}. "
                  "Offline `policy-eval` on the static trainer's recorded documents: "
                  + ", ".join(f"{n} {fmt(v, '.3f')}x" for n, v in off.items() if v is not None)
                  + f"; live balance gain over predicted: "
                  f"{fmt(s['gain_share_of_offline'], '.2f')}. Planner overhead (the loader's "
                  f"own plan through the live planner, A/B against static): "
                  f"{s['overhead_pct_planner']:+.2f}%; recording: "
                  f"{s['overhead_pct_recording']:+.2f}%.", ""]
        steps_of = [(n, s["mean"].get(n, {})) for n in ("tokens", "balance")]
        if all(m.get("window_ratio") for _, m in steps_of):
            lines += ["Where the gain goes, static over the policy on the same steps: "
                      + "; ".join(f"{n}: predicted {fmt(off.get(n), '.3f')}x, the engine on "
                                  f"the live ops' durations {fmt(m['engine_ratio'], '.3f')}x, "
                                  f"the live compute window {fmt(m['window_ratio'], '.3f')}x, "
                                  f"the wall step {fmt(m['ratio'], '.3f')}x" for n, m in steps_of)
                      + ".", ""]
        if all(m.get("pace_vs_static") for _, m in steps_of):
            lines += ["Pace of the ops per modelled second against static's (the same work: "
                      "1 is the same speed, above 1 slower): " + ", ".join(
                          f"{n} {fmt(m['pace_vs_static'], '.3f')}" for n, m in steps_of)
                      + ".", ""]
        split = [(n, m) for n, m in s["mean"].items() if m.get("solo_share") is not None]
        if split:
            lines += ["Ops with no other rank computing beside them: their share of the "
                      "modelled work, and the pace of those ops and of the rest: " + "; ".join(
                          f"{n} {fmt(m['solo_share'], '.3f')}, {fmt(m['pace_solo'], '.3f')} "
                          f"and {fmt(m['pace_overlap'], '.3f')}" for n, m in split) + ".", ""]
        saved, steps = s.get("saving_share_of_offline"), s.get("offline_step_s")
        if saved and steps:
            lines += [f"The prediction's static step is {fmt(steps['static'] * 1e3, '.1f')} ms "
                      "(compute and bubbles: the fit leaves transfers and the rest of a step "
                      f"out) against {fmt(s['mean']['static']['step_s'] * 1e3, '.1f')} ms live, "
                      "so a ratio's gain is diluted live; in seconds saved per step, live over "
                      "predicted: " + ", ".join(f"{n} {fmt(v, '.2f')}" for n, v in saved.items())
                      + ".", ""]
        cn = s.get("cost_noise")
        if cn:
            lines += [f"On the static trainer's ops the cost model's p90 relative error is "
                      f"{fmt(cn['model_p90_rel_error'], '.3f')}; `static` and `loader` ran "
                      f"{fmt(cn['pairs'], '.0f')} identical ops, whose spread puts any model's "
                      f"p90 at {fmt(cn['p90_floor'], '.3f')} or more.", ""]
        if "bound" in s:
            b = s["bound"]
            lines += [f"Bound: the best integer split {b['split']} recovers "
                      f"{b['recovery']:.0%} when a replica takes speed x (M + P - 1).", ""]
    return lines


def r_peers(doc: dict) -> list[str]:
    f, c = doc["features"], doc["commands"]
    m = f["median_s"]
    versions = ", ".join(f"{k} {v}" for k, v in f["peer_versions"].items())
    lines = [f"Medians of {doc['rounds']} rounds, order rotated every round; load average "
             f"{fmt(doc.get('load_before'), '.2f')} -> {fmt(doc.get('load_after'), '.2f')}; "
             f"peers: {versions}.", ""]
    rows = [("56 features shared with mlforecast, 2 threads", fmt(m["bubblecast_56_t2"], ".3f"),
             fmt(m["mlforecast_56_t2"], ".3f"), fmt(f["speedup_vs_mlforecast"], ".2f") + "x"),
            ("the same, 1 thread", fmt(m["bubblecast_56_t1"], ".3f"),
             fmt(m["mlforecast_56_t1"], ".3f"),
             fmt(m["mlforecast_56_t1"] / m["bubblecast_56_t1"], ".2f") + "x"),
            ("whole `build_features` (every feature and target), 2 threads",
             fmt(m["bubblecast_all_t2"], ".3f"), "", "")]
    lines += [f"Features of {f['events']:,} events ({f['series_rows']:,} series rows); values "
              f"checked on {f['check']['rows_compared']:,} rows: max relative difference "
              f"{f['check']['max_rel_diff']:.1e}.", ""]
    lines += table(["what", "bubblecast s", "mlforecast `preprocess` s", "speed-up"], rows)
    ms, sim = c["median_s"], c["simulate"]
    rows = [("`whatif trace-ST --json`", fmt(ms["whatif"], ".3f"),
             f"`import pandas, pyarrow.parquet` {fmt(ms['imports'], '.3f')} s",
             fmt(c["whatif_over_imports"], ".2f") + "x the imports")]
    rows += [(f"`simulate`, {v['events']:,} events", fmt(ms[k], ".3f"),
              f"the bare imports allow {fmt(v['imports_floor_events_per_s'] / 1e6, '.2f')} M/s",
              f"{fmt(v['events_per_s'] / 1e6, '.2f')} M events/s") for k, v in sim.items()]
    lines += ["Commands end to end, new interpreters:", ""]
    return lines + table(["command", "s", "floor", "result"], rows)


def r_plan_costs(doc: dict) -> list[str]:
    lines = [f"Documents setting, loader seed {doc['seed']}, {doc['steps']} steps, each "
             f"micro-batch timed {doc['reps']} times (median), "
             f"{fmt(doc['microbatches_timed'])} micro-batches; transfers left out of both.", ""]
    rows = [(n, fmt(doc["measured_speedup"][n], ".4f") + "x",
             fmt(doc["modelled_speedup"][n], ".4f") + "x",
             fmt(doc["step_s"]["measured"][n] * 1e3, ".1f"),
             fmt(doc["step_s"]["modelled"][n] * 1e3, ".1f"))
            for n in doc["measured_speedup"]]
    lines += table(["plan", "measured vs static", "cost model vs static", "measured step ms",
                    "modelled step ms"], rows)
    r = doc["ratios_to_per_token"]
    return lines + [", ".join(f"{k} / per_token: measured {fmt(v['measured'], '.3g')}, cost "
                              f"model {fmt(v['model'], '.3g')}" for k, v in r.items()) + ".", ""]


def r_plan_worker(doc: dict) -> list[str]:
    lines = [f"Packed GPT ({facts(doc['model'].items())}), one process, one thread; "
             f"{doc['steps']} steps per arm in a shuffled order, the first {doc['warm']} "
             "dropped; paired difference to `none` at the same step.", ""]
    rows = [(arm, fmt(a["step_ms"], ".1f"), f"{a['paired_pct']:+.2f}%",
             f"{a['paired_se_pct']:.2f}%", fmt(a["plan_ms"], ".2f"))
            for arm, a in doc["arms"].items()]
    return lines + table(["arm", "step ms", "vs none", "se", "planning ms per call"], rows)


def r_host_allocator(doc: dict) -> list[str]:
    lines = [f"Documents setting, {doc['steps']} steps x {doc['passes']} passes (the first "
             f"{doc['warm']} dropped), every micro-batch's forward then every backward in one "
             "process; `kept`: a gloo rank's allocator, `system`: glibc's own thresholds.", ""]
    rows = [(name, fmt(a["step_s"]["loader"] * 1e3, ".1f"),
             fmt(a["step_s"]["tokens"] * 1e3, ".1f"), fmt(a["tokens_over_loader"], ".4f"),
             fmt(a["faults_per_step"]["loader"], ".0f"),
             fmt(a["faults_per_step"]["tokens"], ".0f"))
            for name, a in doc["allocators"].items()]
    return lines + table(["allocator", "loader ms", "tokens ms", "tokens / loader",
                          "loader faults a step", "tokens faults a step"], rows)


def r_host_interference(doc: dict) -> list[str]:
    lines = [f"One full micro-batch of {doc['docs']} documents on the documents setting's first "
             f"stage, F+B, one thread; {fmt(doc['seconds'])} s per arm and repeat, arms "
             f"alternating; transfers: 1 MiB each way at {fmt(doc['rate'])} a second.", ""]
    rows = [(arm, *(fmt(v, ".2f") for v in vals)) for arm, vals in doc["median_ms"].items()]
    rows += [(name, *(fmt(v, ".3f") for v in vals)) for name, vals in doc["ratios"].items()]
    return lines + table(["median op ms", *(f"repeat {k + 1}" for k in range(doc["repeats"]))],
                         rows)


def r_device_check(doc: dict) -> list[str]:
    lines = [f"{doc['device']}, torch {doc['torch']} (CUDA {doc['cuda']}); the device's own "
             "image, not this project's pins.", ""]
    for launch in doc.get("launches", []):
        lines.append(f"- `{launch['command']}`: " + "; ".join(
            f"{k}: {v}" for k, v in launch["sections"].items()))
    n = doc.get("nvml", {})
    if "limits" in n:
        lines += ["", f"(0) NVML on {n['name']} (driver {n['driver']}): " + "; ".join(
            f"{key} {value}" for key, value in n["limits"].items()) + ".", ""]
    k = doc.get("kernel", {})
    if "ways" in k:
        lines += ["", f"(i) {k['kernel']}, {k['reps']} reps, against {k['reference']}:", ""]
        lines += table(["way", "median ms", "min", "max", "x reference"],
                       [(n, fmt(w["median_ms"], ".3f"), fmt(w["min_ms"], ".3f"),
                         fmt(w["max_ms"], ".3f"), fmt(w["ratio_to_reference"], ".3f"))
                        for n, w in k["ways"].items()])
    p = doc.get("pipeline", {})
    if "ops" in p:
        lines += [f"(ii) {p['model']}, {p['steps']} steps; recorder timing "
                  f"{p['recorder_timing']}, Kineto import {p['kineto_timing']}:", ""]
        lines += table(["op", "recorder median ms", "ops", "Kineto median ms", "ops", "ratio"],
                       [(op, fmt(o["recorder_median_ms"], ".3f"), o["recorded_ops"],
                         fmt(o["kineto_median_ms"], ".3f"), o["kineto_ops"],
                         fmt(o["ratio"], ".3f")) for op, o in p["ops"].items()])
    if "error" in doc.get("packed", {}):
        lines += [f"(iii) packed GPT: {doc['packed']['error']}.", ""]
    return lines


RENDERERS: dict[str, Callable[[dict], list[str]]] = {
    "schedules": r_schedules, "engine": r_engine, "write": r_write, "load": r_load,
    "dataset": r_dataset, "solver": r_solver, "record": r_record, "migration": r_migration,
    "forecast": r_forecast, "policy": r_policy, "guard": r_guard, "serve": r_serve,
    "live": r_live, "decision_thread": r_decision_thread, "fleet": r_fleet, "read": r_read,
    "balance": r_balance,
    "peers": r_peers, "live_balance": r_live_balance, "plan_worker": r_plan_worker,
    "plan_costs": r_plan_costs, "device_check": r_device_check,
    "host_allocator": r_host_allocator, "host_interference": r_host_interference,
    "calibration_bound": r_calibration_bound, "decision_forecasts": r_decision_forecasts,
}


# ---------------------------------------------------------------------------------------------
# the page


def _machine(doc: dict) -> str | None:
    m, cpus = doc.get("machine"), doc.get("cpus")
    if isinstance(m, dict):
        cpus = cpus or m.get("cpus")
        m = m.get("platform") or facts((k, v) for k, v in m.items() if isinstance(v, str))
    if not m and not cpus:
        return None
    return f"{m or 'not recorded'}" + (f", {cpus} CPUs" if cpus else "")


def command_of(result: Result, short: bool = False) -> str:
    """The command that wrote the file: its own record, else the documented one, marked."""
    doc = result.doc if isinstance(result.doc, dict) else {}
    if isinstance(doc.get("command"), str):
        return f"`{doc['command'].strip()}`"
    documented = DOCUMENTED_COMMANDS.get(result.path.name)
    if documented:
        note = "documented" if short else "documented; the file records no command"
        return f"`{documented}` ({note})"
    return "not recorded in the file"


def render_file(result: Result, rel: str) -> list[str]:
    doc = result.doc
    lines = [f"### {result.path.name}", "", f"- command: {command_of(result)}"]
    if isinstance(doc, dict):
        machine = _machine(doc)
        if machine:
            lines.append(f"- machine: {machine}")
        date = next((doc[k] for k in DATE_KEYS if isinstance(doc.get(k), str)), None)
        if date:
            lines.append(f"- date: {date}")
    lines += [f"- file: `{rel}`", ""]
    render = RENDERERS.get(result.name)
    if render is None or not isinstance(doc, dict):
        return lines + generic(doc)
    try:
        return lines + render(doc)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError, ZeroDivisionError) as exc:
        return lines + [f"(This file does not have the fields the `{result.name}` table reads "
                        f"— {type(exc).__name__}: {exc}; its top-level values instead.)", ""] \
            + generic(doc)


def render_page(results: list[Result], root: Path = ROOT) -> str:
    lines = ["<!-- Generated by tools/results_page.py from benchmarks/results/*.json: do not "
             "edit. Regenerate with `python tools/results_page.py`. -->", "",
             "# Measured figures", "",
             "Every number on this page is read from a JSON file in `benchmarks/results/`, "
             "written by the command shown with it (`make bench` runs every benchmark). What "
             f"the figures mean, the load they ran under and which goals were met: "
             f"[the notes]({NOTES}).", ""]
    names = section_order(results)
    index = [(f"[{n}](#{slug(n)})", ", ".join(f"`{r.path.name}`" for r in results if r.name == n))
             for n in names]
    lines += table(["benchmark", "files"], index)
    for name in names:
        about, notes = ABOUT.get(name, (None, None))
        lines += [f"## {name}", ""]
        if about:
            lines += [about + (f" Notes: [{notes}]({NOTES}#{slug(notes)})." if notes else ""), ""]
        for r in results:
            if r.name == name:
                lines += render_file(r, _rel(r.path, root))
    return "\n".join(lines).rstrip() + "\n"


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


# ---------------------------------------------------------------------------------------------
# README's headline table


def _find(results: list[Result], filename: str) -> Result | None:
    return next((r for r in results if r.path.name == filename), None)


def _headline_rows(results: list[Result]) -> list[tuple[str, str, str]]:
    """(what, figure, command) for the few figures README shows; each skipped when its file
    is missing or has changed shape."""
    rows = []

    def add(filename: str, what: str | Callable[[dict], str],
            figure: Callable[[dict], str]) -> None:
        r = _find(results, filename)
        if r is None:
            return
        try:
            rows.append((what(r.doc) if callable(what) else what, figure(r.doc),
                         command_of(r, short=True)))
        except (KeyError, TypeError, IndexError, ValueError, StopIteration):
            return

    def sched(d: dict) -> str:
        by = {r["schedule"]: r["bubble_fraction"] for r in d["rows"]}
        return ", ".join(f"{s} {by[s]:.4f}" for s in ("1f1b", "zb-h1", "zbv") if s in by)

    def forecast(d: dict) -> str:
        m = d["held_out"]["models"]["lgbm"]
        hs = _horizons(d["held_out"]["models"])
        skill = " / ".join(format(m[h]["skill"], ".3f") for h in hs)
        cover = " / ".join(format(m[h]["coverage_80"], ".3f") for h in hs)
        return f"skill {skill}, coverage {cover} ({' / '.join(hs)})"

    def serve(d: dict) -> str:
        p99 = d["summary"]["bubblecast@500"]["p99_ms"]
        return (f"p99 {p99['median']:.2f} ms (median of runs, {p99['min']:.2f}-{p99['max']:.2f}); "
                f"capacity {spread(d['capacity_speedup_per_pair'], '.1f')}x MLflow's")

    def record(d: dict) -> str:
        m = d["mean_over_runs"]
        return f"wall {m['wall_median_pct']:+.2f}%, CPU {m['cpu_median_pct']:+.2f}%"

    def fleet(d: dict) -> str:
        return f"{d['speedup']:.2f}x ({d['events']:,} events)"

    def engine(d: dict) -> str:
        return f"{d['cold_speedup_min']['opmajor']:.0f}x or more"

    def peers(d: dict) -> str:
        f, c = d["features"], d["commands"]
        v = f["peer_versions"]
        return (f"features {f['speedup_vs_mlforecast']:.2f}x mlforecast {v['mlforecast']}'s "
                f"`preprocess` (2 threads); `whatif` {c['whatif_over_imports']:.2f}x the bare "
                f"pandas+pyarrow import")

    def balance(d: dict) -> str:
        a, b = (d["regimes"][k]["mean"] for k in ("a", "b"))
        return (f"(a) balance {a['balance']['speedup']:.3f}x, tokens "
                f"{a['tokens']['speedup']:.3f}x; (b) balance {b['balance']['speedup']:.3f}x, "
                f"tokens {b['tokens']['speedup']:.3f}x; slow replica recovered "
                + " / ".join(f"{d['slow_replica'][k]['recovery_mean']:.0%}" for k in ("a", "b")))

    def live_documents(d: dict) -> str:
        s = d["settings"]["documents"]
        m, off = s["mean"], s["offline_speedup"]
        floor = (f", no plan beyond {off['optimum']:.3f}x (the exact optimum)"
                 if off.get("optimum") else
                 f", no plan beyond {off['floor']:.3f}x (critical-path floor)"
                 if off.get("floor") else f", perfect-balance bound {off['bound']:.3f}x")
        held = s["cost_model_heldout"]
        own = held["noise"].get("insample_p90")
        own_txt = f", fitted on that run itself {own:.3f}" if own is not None else ""
        return (f"balance {m['balance']['ratio']:.3f}x static, tokens {m['tokens']['ratio']:.3f}x "
                f"({len(s['runs'])} runs; cost model held-out p90 {held['p90_rel_error']:.3f}, "
                f"noise floor {held['noise']['p90_floor']:.3f}{own_txt}); offline on the same "
                f"documents: balance {off['balance']:.3f}x{floor}")

    def live_slow(d: dict) -> str:
        s = d["settings"]["slow-replica"]
        rec = [r["balance"]["recovery"] for r in s["runs"]]
        return (f"balance recovers {s['mean']['balance']['recovery']:.0%} of the slowdown (runs "
                + ", ".join(f"{x:.0%}" for x in rec) + f"; integer-split bound "
                f"{s['bound']['recovery']:.0%}), tokens {s['mean']['tokens']['recovery']:.0%}; "
                f"{s['mean']['balance']['ratio']:.3f}x static, no layer moved")

    def learned(d: dict) -> str:
        g = d["goals"]
        sign = g.get("ahead_from_sign_mean_pct")
        steps = g["lead_steps"]
        moves = ", ".join(str(x) for x in steps) if len(steps) <= 3 else \
            f"{min(steps)} to {max(steps)}"
        return (f"first move {moves} steps before reactive; "
                f"predictive vs reactive {g['ahead_mean_pct']:+.1f}% (mean of {g['runs']})"
                + ("" if sign is None else f", {sign:+.1f}% counted from the fault's first "
                   "sign") + f"; {g['share_mean']:.2f} of the scripted run's gain; plain ramp "
                f"{g['plain_gap_pct']:+.2f}% vs reactive"
                + ("" if "scripted_self_share" not in g else
                   f"; the scripted run against itself {min(g['scripted_self_share']):.2f}-"
                   f"{max(g['scripted_self_share']):.2f} of its gain (predictive "
                   f"{min(g['share_of_scripted_gain']):.2f}-"
                   f"{max(g['share_of_scripted_gain']):.2f})"))

    def decisions(d: dict) -> str:
        setups = d["results"]
        names = list(setups)
        parts = []
        for family in setups[names[0]]["families"]:
            cells = []
            for name in names:
                m = setups[name]["families"].get(family, {}).get("summary", {})
                if m.get("lgbm") is not None and m.get("scored_runs", 0) > 1:
                    few = m["scored_runs"] < m.get("runs", 0) / 2  # the oracle gains on few
                    cells.append(f"{m['lgbm']:.3f} / {m['trend']:.3f} ({name}"
                                 + (f", {m['scored_runs']} scored runs" if few else "") + ")")
            if cells:
                parts.append(f"{family} " + ", ".join(cells))
        return "; ".join(parts) + (f"; LightGBM >= trend (thermal: by 3 points) in "
                                   f"{d['goals met']} family-setups")

    add("schedules.json", lambda d: "Bubble fraction at the zero-bubble paper's Table-5 "
        f"setting (P={d['setting']['stages']}, M={d['setting']['microbatches']})", sched)
    add("engine.json", "Timing engine against the reference event loop, slowest schedule, cold "
        "caches", engine)
    add("forecast.json", "LightGBM forecasts on held-out runs: skill against the best "
        "baseline, p10-p90 coverage", forecast)
    add("decisions-pooled.json", lambda d: "Decisions, not MAE: oracle share of predictive on "
        f"a trained LightGBM / on the built-in trend, {d['test_runs']} held-out runs per family "
        f"({len(d['pooled'])} draws), README's policy setup and the sample runs' (thermal: "
        "device covariates)", decisions)
    add("balance.json", "Per-step work planning on packed documents over the data loader's "
        "order, (a) short documents, (b) a long tail (4 stages x 8 micro-batches x 4 "
        "replicas, simulated)", balance)
    add("live_balance-documents.json", "Per-step work planning live, documents only (packed "
        "GPT, 4096-token budget, 2 CPU stages x 4 micro-batches)", live_documents)
    add("live_balance-documents-latest.json", "The same, the latest launch (3 runs)",
        live_documents)
    add("live_balance.json", "Per-step work planning live, one replica 1.5x slower (2 replicas "
        "x 2 CPU stages, 4 micro-batches each)", live_slow)
    add("live-learned.json", lambda d: "Live thermal lead from a trained LightGBM with device "
        f"covariates, held-out fault ({d['inject']}; 2 CPU stages; the latest launch, the "
        "results notes list every launch)", learned)
    add("live-learned-self.json", "The same, 15 runs in one launch, the scripted run measured "
        "twice", learned)
    add("peers.json", "Beside the peers on the same work (10.24M events; trace-ST)", peers)
    add("bench_serve.json", "Prediction service at 500 requests/s offered", serve)
    add("bench_fleet-2000x800.json", lambda d: f"`dataset` on a fleet of {d['runs']:,} runs, "
        f"`--cluster local:{d['workers']}` against in process ({d['cpus']} cores)", fleet)
    add("record.json", lambda d: "`bubblecast.record` overhead, default settings (mean of "
        f"{len(d['runs'])} runs' medians)", record)
    return rows


def render_headline(results: list[Result]) -> str:
    rows = _headline_rows(results)
    lines = [HEAD_START,
             "<!-- Generated by tools/results_page.py from benchmarks/results/*.json. -->",
             *table(["what", "figure", "command"], rows)]
    return "\n".join(lines).rstrip() + "\n" + HEAD_END


def with_headline(readme: str, results: list[Result]) -> str:
    """README with the block between the markers regenerated (unchanged without markers)."""
    start, end = readme.find(HEAD_START), readme.find(HEAD_END)
    if start < 0 or end < start:
        return readme
    return readme[:start] + render_headline(results) + readme[end + len(HEAD_END):]


# ---------------------------------------------------------------------------------------------
# main


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if the page or README's headline table is stale")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of benchmark JSON")
    ap.add_argument("--page", type=Path, default=PAGE, help="the page to write")
    ap.add_argument("--readme", type=Path, default=README,
                    help="README whose headline table is regenerated (if it has the markers)")
    args = ap.parse_args(argv)
    results = load_results(args.results)
    targets = [(args.page, render_page(results))]
    if args.readme.exists():
        targets.append((args.readme, with_headline(args.readme.read_text(), results)))
    stale = [p for p, text in targets if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p} is stale: run `python tools/results_page.py`", file=sys.stderr)
        return 1 if stale else 0
    for p, text in targets:
        if p in stale:
            atomic_write(p, text)
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
