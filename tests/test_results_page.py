"""The results page (docs/results.md) is generated from benchmarks/results/*.json and current.

A benchmark that writes new JSON must regenerate the page (``python tools/results_page.py``);
this test fails until it does. It also checks that every JSON file's benchmark has a section,
that a benchmark the tool does not know still appears (generic table), and that the links from
the page into the hand-written notes land on a heading there.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "results_page.py"
PAGE = ROOT / "docs" / "results.md"
NOTES = ROOT / "docs" / "results-notes.md"


def _tool():
    spec = importlib.util.spec_from_file_location("results_page", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["results_page"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_committed_page_and_readme_table_are_current():
    done = subprocess.run([sys.executable, str(TOOL), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        f"{done.stderr.strip()}\nA benchmark wrote new JSON (or the tool changed): run "
        "`python tools/results_page.py` and commit docs/results.md and README.md.")


def test_page_mentions_every_json_file_and_its_benchmark():
    rp = _tool()
    page = PAGE.read_text()
    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert files
    for path in files:
        name = rp.benchmark_name(path, json.loads(path.read_text()))
        assert f"\n## {name}\n" in page, f"no section for benchmark {name!r} ({path.name})"
        assert f"\n### {path.name}\n" in page, f"{path.name} is not on the page"


def test_unknown_benchmark_gets_the_generic_table_and_check_sees_staleness(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench_newthing-2.json").write_text(json.dumps(
        {"benchmark": "newthing", "machine": "m", "cpus": 4, "command": "python x.py --n 3",
         "wall_s": 1.25, "rows": 1200, "ok": True, "nested": {"skip": 1}}))
    (results / "schedules.json").write_text(json.dumps({"benchmark": "schedules", "rows": 3}))
    page, readme = tmp_path / "results.md", tmp_path / "README.md"
    readme.write_text("intro\n<!-- headline:start -->\nold\n<!-- headline:end -->\nrest\n")
    args = ["--results", str(results), "--page", str(page), "--readme", str(readme)]
    rp = _tool()
    assert rp.main(args + ["--check"]) == 1  # no page yet
    assert rp.main(args) == 0
    assert rp.main(args + ["--check"]) == 0
    text = page.read_text()
    assert "## newthing" in text and "### bench_newthing-2.json" in text
    assert "`python x.py --n 3`" in text and "m, 4 CPUs" in text
    assert "| `wall_s` | 1.25 |" in text and "| `rows` | 1,200 |" in text
    assert "| `ok` | yes |" in text and "skip" not in text
    # a known benchmark whose file lacks the fields its table reads falls back, saying so
    assert "does not have the fields the `schedules` table reads" in text
    assert "| `rows` | 3 |" in text
    # README outside the markers is untouched; inside, the table (empty: no known files)
    out = readme.read_text()
    assert out.startswith("intro\n<!-- headline:start -->") and out.endswith("-->\nrest\n")
    assert "old" not in out
    (results / "bench_newthing-2.json").write_text(json.dumps({"benchmark": "newthing"}))
    assert rp.main(args + ["--check"]) == 1  # new JSON, page not regenerated


def test_links_into_the_notes_land_on_headings():
    rp = _tool()
    headings = {rp.slug(m) for m in re.findall(r"^#+ (.+)$", NOTES.read_text(), re.M)}
    for anchor in set(re.findall(r"results-notes\.md#([\w-]+)", PAGE.read_text())):
        assert anchor in headings, f"results.md links to a missing notes heading #{anchor}"
