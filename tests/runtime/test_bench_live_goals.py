"""bench_live's learned goals: the per-run shares and the scripted run's share of itself."""

from __future__ import annotations

import pytest

from benchmarks.bench_live import AGAIN, ORACLE, learned_goals


def _launch(ratios: dict[str, float], lead_steps: int = 20) -> dict:
    first = {"reactive": 130, "predictive": 130 - lead_steps}
    return {name: {"ratio_slowed": r, "ratio_from_sign": r,
                   "first_response_step": first.get(name)} for name, r in ratios.items()}


def _runs(rows: list[dict[str, float]]) -> list[dict]:
    return [{"lead": _launch(r), "plain": _launch({k: v for k, v in r.items() if k != AGAIN})}
            for r in rows]


def test_self_share_is_the_second_scripted_gain_over_the_first():
    rows = [{"static": 1.0, "reactive": 1.2, "predictive": 1.25, ORACLE: 1.3, AGAIN: 1.24},
            {"static": 1.0, "reactive": 1.2, "predictive": 1.3, ORACLE: 1.25, AGAIN: 1.3}]
    g = learned_goals(_runs(rows))
    assert g["scripted_self_share"] == pytest.approx([0.24 / 0.3, 0.3 / 0.25])
    assert g["share_of_scripted_gain"] == pytest.approx([0.25 / 0.3, 0.3 / 0.25])
    assert g["scripted_self_under_0_85"] == 1  # 0.8
    assert g["predictive_under_0_85"] == 1  # 0.833
    assert g["scripted_self_share_sd"] == pytest.approx(abs(0.8 - 1.2) / 2**0.5)


def test_no_self_share_without_the_second_scripted_trainer():
    rows = [{"static": 1.0, "reactive": 1.2, "predictive": 1.25, ORACLE: 1.3}]
    g = learned_goals(_runs(rows))
    assert "scripted_self_share" not in g
    assert g["share_every_run_ge_0_85"] is False
