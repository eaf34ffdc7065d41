"""megatron-log and deepspeed-log: every documented timer layout, coarse summaries, refusals.

Fixtures in tests/telemetry/fixtures/ were written by hand from the documented layouts (see the
README there). Malformed variants are made here from them, one broken line each.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bubblecast.cli import main
from bubblecast.errors import BubblecastError
from bubblecast.telemetry.importers import detect_format, granularity, load_events

FIXTURES = Path(__file__).parent / "fixtures"
VARIANTS = {  # file -> (format, values, per rank, ranks, steps)
    "megatron-minmax.log": ("megatron-log", "min and max across ranks", False, 1, [10, 20]),
    "megatron-max.log": ("megatron-log", "max across ranks", False, 1, [10, 20]),
    "megatron-all.log": ("megatron-log", "per rank", True, 8, [10, 20]),
    "megatron-old.log": ("megatron-log", "one rank (unnamed)", False, 1, [10, 20]),
    "deepspeed-rank.log": ("deepspeed-log", "per rank", True, 2, [10, 20]),
    "deepspeed-rankeq.log": ("deepspeed-log", "per rank", True, 2, [0, 1]),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_documented_variant_parses(name):
    fmt, values, per_rank, ranks, steps = VARIANTS[name]
    path = FIXTURES / name
    assert detect_format(path) == fmt
    events = load_events(path)
    meta = next(iter(events.runs.values()))
    assert meta.source == fmt and granularity(events) == "step"
    assert (meta.extra["granularity"], meta.extra["timing"]) == ("step", "host")
    assert meta.extra["values"] == values and meta.extra["per_rank"] is per_rank
    frame = events.frame
    assert sorted(frame["step"].unique()) == steps
    assert frame["rank"].nunique() == ranks
    assert (frame["microbatch"] == -1).all()
    # one F and one B per step and rank, whatever the stack calls them
    comp = frame[frame["op"].isin(["F", "B"])]
    assert len(comp) == 2 * ranks * len(steps)


def test_megatron_minmax_keeps_both_ends_and_the_layout():
    events = load_events(FIXTURES / "megatron-minmax.log")
    meta = events.runs["megatron-minmax"]
    assert (meta.stages, meta.replicas, meta.microbatches) == (4, 2, 4)
    f = events.frame[(events.frame["name"] == "forward-compute") & (events.frame["step"] == 10)]
    assert f["duration_s"].iloc[0] == pytest.approx(0.5614)
    assert f["min_s"].iloc[0] == pytest.approx(0.2681)
    assert meta.extra["step_time_s"] == {"10": pytest.approx(2.1805), "20": pytest.approx(2.1701)}


def test_megatron_all_places_ranks_by_megatron_order():
    frame = load_events(FIXTURES / "megatron-all.log").frame
    placed = frame.groupby("rank")[["stage", "replica"]].first()
    assert placed.loc[7].tolist() == [3, 1] and placed.loc[2].tolist() == [1, 0]


def test_deepspeed_interval_sums_become_per_step_times():
    events = load_events(FIXTURES / "deepspeed-rank.log")
    frame = events.frame
    f = frame[(frame["op"] == "F") & (frame["rank"] == 3) & (frame["step"] == 10)]
    assert f["duration_s"].iloc[0] == pytest.approx(0.560)  # 5600 ms over 10 steps
    placed = frame.groupby("rank")["stage"].first()
    assert placed.to_dict() == {0: 0, 3: 3}  # from the ProcessCoord topology line


def test_deepspeed_second_timer_of_one_op_is_kept_as_other():
    frame = load_events(FIXTURES / "deepspeed-rankeq.log").frame
    assert set(frame.loc[frame["op"] == "F", "name"]) == {"forward"}
    assert set(frame.loc[frame["name"] == "train_batch", "op"]) == {"OTHER"}


def _inspect(path, capsys):
    assert main(["inspect", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_reports_what_a_per_rank_log_supports(capsys):
    out = _inspect(FIXTURES / "megatron-all.log", capsys)
    assert (out["granularity"], out["timing"]) == ("step", "host")
    assert (out["stages"], out["replicas"], out["steps"]) == (4, 2, 2)
    assert out["bottleneck_stage"] == 3 and out["slowest_rank"] == 7
    assert out["structural_bubble_fraction"] is None and out["slow_ranks"] is None
    ranks = {r["rank"]: r for r in out["per_rank"]}
    # rank 0: 0.268 + 0.575 s of compute in a 2.175 s step
    assert ranks[0]["bubble_fraction"] == pytest.approx(1 - 0.843 / 2.1753, abs=2e-3)
    assert ranks[7]["bubble_fraction"] < ranks[0]["bubble_fraction"]
    busy = {s["stage"]: s["busy_s"] for s in out["per_stage"]}
    assert 1.5 < busy[3] / busy[0] < 1.7


def test_inspect_on_an_aggregate_log_sets_what_it_cannot_say_to_null(capsys):
    out = _inspect(FIXTURES / "megatron-max.log", capsys)
    assert out["per_rank"] is None and out["bottleneck_stage"] is None
    assert out["slowest_rank"] is None and out["stages"] is None
    assert out["bubble_fraction"] == pytest.approx(1 - (0.5614 + 0.8227) / 2.1805, abs=0.01)
    assert "lower bound" in out["bubble_fraction_basis"]


@pytest.mark.parametrize("argv", [
    ["whatif", "{log}", "--json"],
    ["inspect", "{log}", "--plot", "{out}"],
    ["inspect", "{log}", "--perfetto", "{out}"],
    ["policy-eval", "{log}", "--json"],
    ["dataset", "{log}", "--out", "{out}"],
])
def test_commands_needing_per_op_order_refuse_logs(argv, tmp_path, capsys):
    log, out = FIXTURES / "megatron-all.log", tmp_path / "features.parquet"
    args = [a.format(log=log, out=out) for a in argv]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "per-op order" in captured.err and "megatron-timeline" in captured.err
    assert not out.exists()


BROKEN = {  # fixture, line number (1-based), replacement, expected words
    "megatron-minmax.log": (6, "    forward-compute ....................: (268.10; 561.40)",
                            "expected '(min, max)'"),
    "megatron-max.log": (4, "[default0]:    forward-compute ........: fast", "not a number"),
    "megatron-all.log": (7, "     rank  0: -3.5", "negative duration -0.0035 s"),
    "megatron-old.log": (3, "time (ms) | forward-compute 561.40 | backward-compute: 822.70",
                         "not 'name: value'"),
    "deepspeed-rank.log": (5, "[Rank 0] time (ms) | forward_microstep: 1,2 | x: 1",
                           "not a number"),
    "deepspeed-rankeq.log": (2, "rank=0 time (ms) | train_batch: nan", "not a number"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_malformed_line_is_refused_naming_file_and_line(name, tmp_path, capsys):
    lineno, text, words = BROKEN[name]
    lines = (FIXTURES / name).read_text().splitlines()
    lines[lineno - 1] = text
    bad = tmp_path / name
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(BubblecastError, match=f"line {lineno}: .*{re.escape(words)}"):
        load_events(bad)
    plot = tmp_path / "out.png"
    assert main(["inspect", str(bad), "--json", "--plot", str(plot)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert f"{bad}: line {lineno}:" in captured.err
    assert not plot.exists()


def test_a_repeated_timer_without_a_step_line_between_is_refused(tmp_path):
    lines = (FIXTURES / "megatron-minmax.log").read_text().splitlines()
    bad = tmp_path / "twice.log"
    bad.write_text("\n".join(lines[:9] + lines[4:9]) + "\n")
    with pytest.raises(BubblecastError, match=r"line 11: timer 'forward-backward'.*again"):
        load_events(bad)


def test_text_without_timer_lines_is_not_a_log(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("hello\nworld\n")
    with pytest.raises(BubblecastError, match="cannot detect the format"):
        detect_format(other)
