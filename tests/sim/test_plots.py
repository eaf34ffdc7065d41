"""Pictures (``inspect --plot``) and the Perfetto export (``inspect --perfetto``)."""

from __future__ import annotations

import json

import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.sim.accounting import inspect_summary
from bubblecast.sim.perfetto import trace_events, write_perfetto
from bubblecast.sim.plots import plot_inspect
from bubblecast.telemetry import write_events
from tests.sim.test_replay import synthetic_run

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run():
    return synthetic_run("zb-h1", 4, 6, replicas=2, steps=4, comm=1e-4, jitter=0.2,
                         allreduce=1e-3)


def test_plot_writes_a_png_with_timeline_and_heatmap(run, tmp_path):
    import matplotlib.image as mpimg

    path = plot_inspect(run, inspect_summary(run), tmp_path / "t.png", steps=[1, 2])
    assert path.read_bytes()[:8] == PNG
    height, width = mpimg.imread(path).shape[:2]
    assert width > 1000 and height > 500
    with pytest.raises(BubblecastError, match="--steps"):
        plot_inspect(run, inspect_summary(run), tmp_path / "x.png", steps=[99])
    assert not (tmp_path / "x.png").exists()


def test_perfetto_trace_has_one_process_per_rank_and_every_op(run, tmp_path):
    path = write_perfetto(run, tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(run)
    assert {e["pid"] for e in spans} == set(run.frame["rank"].unique().tolist())
    names = [e for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert len(names) == run.frame["rank"].nunique()
    assert min(e["ts"] for e in spans) == 0.0
    f = run.frame
    span = (f["start_s"] + f["duration_s"]).groupby(f["step"]).max() - \
        f["start_s"].groupby(f["step"]).min()
    last = max(e["ts"] + e["dur"] for e in spans)
    assert last == pytest.approx(1e6 * (span.sum() + 0.02 * span.iloc[:-1].sum()), rel=1e-6)
    one = trace_events(run, steps=[2])
    assert sum(e["ph"] == "X" for e in one) == int((f["step"] == 2).sum())


def test_inspect_cli_plot_and_perfetto(run, tmp_path, capsys):
    src = tmp_path / "run.parquet"
    write_events(run, src)
    png, js = tmp_path / "tl.png", tmp_path / "tr.json"
    args = ["inspect", str(src), "--plot", str(png), "--perfetto", str(js), "--steps", "0,3"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "syn"
    assert png.read_bytes()[:8] == PNG
    assert {e["args"]["step"] for e in json.loads(js.read_text())["traceEvents"]
            if e["ph"] == "X"} == {0, 3}
    assert main(["inspect", str(src), "--plot", str(png), "--steps", "7"]) == 2
    assert "--steps" in capsys.readouterr().err
