"""The shipped sample data (``data/``) and default forecaster (``models/default``) stay usable:
small readable files, each documented, and a model that ``evaluate``, ``serve`` and the
predictive policy accept with no training."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bubblecast.cli import main

ROOT = Path(__file__).resolve().parents[1]
DATA, MODEL = ROOT / "data", ROOT / "models" / "default"
#: Files bubblecast made (simulated or recorded here); the rest of data/ is copied public data.
MADE_HERE = ("sim", "live", "documents")
SAMPLES = sorted(p for d in MADE_HERE for p in (DATA / d).rglob("*.parquet"))
COPIED = sorted(p for p in DATA.iterdir() if p.is_dir() and p.name not in MADE_HERE)


def test_copied_public_data_keeps_its_licence_and_is_documented():
    readme = (DATA / "README.md").read_text()
    assert {p.name for p in COPIED} >= {"megatron-ops", "hta-gpu-traces"}
    for folder in COPIED:
        assert any(f.name.upper().startswith("LICENSE") for f in folder.iterdir()), folder.name
        assert f"`{folder.name}/`" in readme, folder.name
        for path in folder.iterdir():
            if path.name.upper().startswith(("LICENSE", "README")):
                continue
            assert path.stat().st_size < 1 << 20, path.name
            rel = path.relative_to(DATA).as_posix()
            # each file is named in the README (or its folder's README), with what it is
            local = folder / "README.md"
            docs = readme + (local.read_text() if local.exists() else "")
            assert path.name in docs, rel


def test_every_sample_file_is_small_readable_and_documented():
    from bubblecast.telemetry.importers import load_events

    readme = (DATA / "README.md").read_text()
    assert len(SAMPLES) >= 7
    made_json = sorted(p for d in MADE_HERE for p in (DATA / d).rglob("*.json"))
    for path in SAMPLES + made_json:
        rel = path.relative_to(DATA).as_posix()
        assert path.stat().st_size < 1 << 20, rel
        # the README names the file and gives the command that wrote it
        line = next((ln for ln in readme.splitlines() if f"`{rel}`" in ln), "")
        if path.suffix == ".json" and not path.name.endswith(".actions.json"):
            # an input file (document lengths for `simulate --documents`): the script that made it
            assert re.search(r"`python -c .*data/" + re.escape(rel), readme), rel
            continue
        assert re.search(r"`bubblecast (simulate|collect|run) .*--out data/" + re.escape(
            rel.replace(".actions.json", ".parquet")), line), rel
    for path in SAMPLES:
        events = load_events(path)
        # forecasting samples are long runs; the packed-document runs (policy-eval's work
        # balancing) are short, their document lengths in the metadata taking the room
        assert events.frame["step"].nunique() >= (40 if path.parent.name == "documents" else 300)
    live = load_events(DATA / "live" / "cpu-slowdown.parquet")
    assert live.runs["cpu-slowdown"].source != "bubblecast simulate"


def test_default_model_card_matches_the_model():
    from bubblecast.forecast.modeldir import load_model, read_model_json

    doc = read_model_json(MODEL)
    model = load_model(MODEL)
    assert model.kind == "lgbm" and list(model.horizons_) == [1, 5, 10]
    readme = (ROOT / "models" / "README.md").read_text()
    assert "bubblecast train build/data-features.parquet --model lgbm --out models/default" \
        in readme
    assert doc["dataset"]["fingerprint"] in readme
    for h, m in doc["metrics"].items():  # the README's table is the model's own metrics
        row = f"| {h[1:]} | {m['n']} | {m['mae']:.5f} | {m['coverage_80']:.3f} | " \
              f"{m['skill']:.3f} | {m['baseline']} |"
        assert row in readme


def test_default_model_records_its_coverage_on_new_runs_inside_the_band():
    """``model.json``'s ``coverage``: p10-p90 coverage on 48 runs of new seeds (written by
    ``benchmarks/calibration_spread.py --record-model``), inside 0.78-0.82 at every horizon;
    its standard error over runs is stated beside it and small enough for the band to mean
    something (the se of a reading, not a tolerance: the recorded value is deterministic)."""
    from bubblecast.forecast.modeldir import read_model_json

    cov = read_model_json(MODEL)["coverage"]
    assert "--record-model models/default" in cov["command"]
    lo, hi = cov["band"]
    assert (lo, hi) == (0.78, 0.82)
    for h in ("h1", "h5", "h10"):
        c = cov["held_out"][h]
        assert c["runs"] >= 40 and c["se"] < 0.015, (h, c)
        assert lo <= c["coverage"] <= hi, (h, c)


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("features") / "sample.parquet"
    assert main(["dataset", str(DATA / "sim" / "throttle.parquet"),
                 str(DATA / "sim" / "seqlen.parquet"), "--out", str(out), "--json"]) == 0
    return out


def test_evaluate_accepts_the_default_model(features, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(features), "--model", str(MODEL), "--no-track", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for h in ("h1", "h5", "h10"):
        m = summary["models"]["lgbm"][h]
        assert 0.0 <= m["coverage_80"] <= 1.0 and np.isfinite(m["mae"])


def test_the_service_serves_the_default_model():
    from bubblecast.serve.predictor import Predictor
    from bubblecast.telemetry.importers import load_events

    predictor = Predictor.from_source(str(MODEL))
    events = load_events(DATA / "live" / "cpu-slowdown.parquet")
    comp = events.compute().groupby(["stage", "step"], observed=True)["duration_s"].sum()
    window = 80
    ranks = [{"rank": s, "stage": s, "compute_s": comp.loc[s].to_numpy()[-window:].tolist()}
             for s in (0, 1)]
    out = predictor.forecast({"pipeline": {"schedule": "1f1b", "stages": 2, "microbatches": 4},
                              "horizons": [1, 5, 10], "ranks": ranks})
    assert out.horizons == [1, 5, 10]
    for r in out.ranks:
        assert all(0 < a <= b <= c for a, b, c in zip(r.p10, r.p50, r.p90, strict=True))
    # rank 1 runs at 2x by the end of the run: the forecast keeps it the slower one
    assert out.ranks[1].p50[0] > out.ranks[0].p50[0]
    assert all(0.0 <= b < 1.0 for b in out.bubble_fraction)


def test_the_predictive_policy_uses_the_default_model():
    from bubblecast.forecast.modeldir import load_model
    from bubblecast.policy.policy_evaluation import EvalConfig, evaluate_events
    from bubblecast.telemetry.importers import load_events

    events = load_events(DATA / "sim" / "mixed.parquet")
    result, _ = evaluate_events(events, ["static", "predictive"], EvalConfig(),
                                load_model(MODEL), run_ids=["mixed-0"])
    assert result["forecaster"] == "trained model 'lgbm'"
    assert result["policies"]["predictive"]["step_s"] > 0
