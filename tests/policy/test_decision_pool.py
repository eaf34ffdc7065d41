"""bench_decisions --pool: draws of other held-out seeds summarized as one, foreign files
refused with one line naming them (exit 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_decisions as bd  # noqa: E402


def _row(run_id: str, oracle: float, trend: float, lgbm: float) -> dict:
    return {"run_id": run_id, "oracle_gain": oracle, "scored": True,
            **{n: {"gain": g, "share": g / oracle, "moves": 1, "fallback_decisions": 0}
               for n, g in (("reactive", 0.0), ("trend", trend), ("lgbm", lgbm))}}


def _draw(base: int, rows: list[dict], families: tuple[str, ...] = ("throttle",)) -> dict:
    return {"train_runs": 12, "trees": 150, "horizons": [1, 5], "train_seed_base": 1000,
            "setups": {"sample": {}}, "test_runs": len(rows), "test_seed_base": base,
            "thermal_margin": bd.THERMAL_MARGIN,
            "results": {"sample": {"families": {f: {"runs": rows} for f in families}}}}


def _write(tmp_path: Path, name: str, doc: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_pooled_draws_are_summarized_as_one(tmp_path):
    a = [_row("a0", 0.2, 0.18, 0.19), _row("a1", 0.1, 0.09, 0.08)]
    b = [_row("b0", 0.4, 0.2, 0.36)]
    out = tmp_path / "pooled.json"
    bd.pool_draws([_write(tmp_path, "a.json", _draw(90000, a)),
                   _write(tmp_path, "b.json", _draw(50000, b))], str(out))
    doc = json.loads(out.read_text())
    assert doc["test_runs"] == 3 and doc["test_seed_bases"] == [90000, 50000]
    summary = doc["results"]["sample"]["families"]["throttle"]["summary"]
    assert summary == bd.summarize(a + b, 0.0)
    assert summary["lgbm"] == pytest.approx((0.95 + 0.8 + 0.9) / 3)
    assert summary["lgbm_weighted"] == pytest.approx((0.19 + 0.08 + 0.36) / 0.7)


@pytest.mark.parametrize(("second", "why"), [
    ({"results": {}}, "missing key 'train_runs'"),
    (_draw(90000, [_row("x", 0.1, 0.1, 0.1)]), "not another draw"),  # the same seed base
    (_draw(50000, [_row("x", 0.1, 0.1, 0.1)], ("mixed",)), "not another draw"),
])
def test_a_file_that_is_not_another_draw_is_refused_in_one_line(tmp_path, capsys, second, why):
    first = _write(tmp_path, "a.json", _draw(90000, [_row("a0", 0.2, 0.18, 0.19)]))
    other = _write(tmp_path, "b.json", second)
    with pytest.raises(SystemExit) as exc:
        bd.pool_draws([first, other], str(tmp_path / "out.json"))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{other}: ") and why in err and "\n" not in err
    assert not (tmp_path / "out.json").exists()
