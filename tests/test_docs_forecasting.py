"""docs/forecasting.md's example runs as written: its first two bash blocks, command by
command, through the installed ``bubblecast`` (simulate, dataset, train, policy-eval with the
model and with the trend)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "forecasting.md"


def guide_commands() -> list[str]:
    """The shell commands of the guide's first two ``bash`` blocks (continuations joined,
    comments dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S)[:2]
    lines = " ".join(b.replace("\\\n", " ") + "\n" for b in blocks).splitlines()
    return [c for c in (line.split("#")[0].strip() for line in lines) if c]


def test_the_guide_example_runs(tmp_path: Path) -> None:
    commands = guide_commands()
    assert [c.split()[1] for c in commands] == ["simulate", "simulate", "dataset", "train",
                                                "policy-eval", "policy-eval"]
    bindir = str(Path(sys.executable).parent)
    for command in commands:
        done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True,
                              env={"PATH": bindir + ":/usr/bin:/bin", "HOME": str(tmp_path)},
                              timeout=300)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    model = json.loads((tmp_path / "with-model.json").read_text())
    trend = json.loads((tmp_path / "with-trend.json").read_text())
    assert model["forecaster"] == "trained model 'lgbm'" and model["fallback"] is None
    assert trend["forecaster"].startswith("built-in robust trend")
    for doc in (model, trend):  # the keys the guide tells the reader to compare
        p = doc["policies"]["predictive"]
        assert {"speedup_vs_static", "oracle_share", "oracle_share_mean"} <= set(p)
        assert p["runs"] == 6 and len(doc["runs"]) == 6
