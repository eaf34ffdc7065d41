"""The public Python API: lazy exports from ``bubblecast`` and the facades."""

from __future__ import annotations

import json
import subprocess
import sys

import bubblecast

HEAVY = ("numpy", "pandas", "pyarrow", "torch", "mlflow", "lightgbm", "matplotlib", "sklearn")


def test_import_bubblecast_loads_no_heavy_library():
    code = ("import json, sys, bubblecast; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == []


def test_every_public_name_resolves_and_is_listed_by_dir():
    for name in bubblecast.__all__:
        assert getattr(bubblecast, name) is not None, name
    assert set(bubblecast.__all__) <= set(dir(bubblecast))
    assert "importlib" not in dir(bubblecast)


def test_unknown_name_raises_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bubblecast.nope  # noqa: B018


def test_all_lists_exactly_the_exports():
    assert set(bubblecast.__all__) == set(bubblecast._EXPORTS) | {"BubblecastError",
                                                                  "__version__"}


# -- BubbleAnalysis ----------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from bubblecast.cli import main  # noqa: E402

DATA_SIM = sorted((Path(__file__).resolve().parents[1] / "data" / "sim").glob("*.parquet"))


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _plain(obj: dict) -> dict:
    """A dict as its JSON text reads back (tuples as lists); NaN would fail the equality."""
    return json.loads(json.dumps(obj))


@pytest.mark.parametrize("path", DATA_SIM, ids=lambda p: p.stem)
def test_analysis_summary_is_the_inspect_json(path, capsys):
    from bubblecast import BubbleAnalysis

    run = bubblecast.read_events(path).run_ids[0]
    analysis = BubbleAnalysis(path, run_id=run)
    assert _plain(analysis.summary()) == _cli_json(capsys, "inspect", str(path), "--run", run)
    stages = analysis.per_stage()
    assert list(stages["stage"]) == list(range(analysis.summary()["stages"]))
    assert stages["busy_s"].sum() == pytest.approx(analysis.per_rank()["busy_s"].sum())
    assert {"rank", "stage", "replica", "bubble_fraction"} <= set(analysis.per_rank().columns)


def test_analysis_whatif_is_the_whatif_json(capsys):
    from bubblecast import BubbleAnalysis

    path = DATA_SIM[0]
    run = bubblecast.read_events(path).run_ids[0]
    expected = _cli_json(capsys, "whatif", str(path), "--run", run)
    assert _plain(BubbleAnalysis(path, run_id=run).whatif()) == expected
    assert set(expected["scenarios"]) == {"ideal", "fix_bottleneck", "no_slow_ranks",
                                          "balanced"}


def test_analysis_of_events_replays_plots_and_writes_perfetto(tmp_path):
    from bubblecast import BubbleAnalysis, SimConfig, simulate_events

    events = simulate_events(SimConfig(stages=3, microbatches=4, steps=4, scenario="jitter"))
    analysis = BubbleAnalysis(events)
    assert analysis.events is events
    summary = analysis.summary()
    assert summary["steps"] == 4 and summary["stages"] == 3
    rep = analysis.replay()
    assert rep.replayed_step_s.shape == (4,) and len(rep.start) == len(events)
    assert (rep.end >= rep.start).all()
    assert len(analysis.per_step()) == 4
    png = analysis.plot(tmp_path / "a.png", steps=[1])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads(analysis.to_perfetto(tmp_path / "t.json", steps=[0]).read_text())
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["step"] for e in ops} == {0}
    assert len(ops) == int((events.frame["step"] == 0).sum())


def test_analysis_refuses_a_missing_file_in_one_line(tmp_path):
    from bubblecast import BubbleAnalysis, BubblecastError

    with pytest.raises(BubblecastError, match="no such file"):
        BubbleAnalysis(tmp_path / "missing.parquet").summary()
