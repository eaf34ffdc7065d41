"""Issue 16, item 2: a model directory copied over the served one, file by file, never gives
a hybrid model: every answer is exactly the old model's or the new model's.

The directory holds ``model.json`` (scale, and the sha256 of each file it lists) and
``spread.json`` (the p10/p90 spread, like a booster file). The copy rewrites each file in
place with pauses (a slow ``cp``), ``model.json`` first: the watcher used to fingerprint
``model.json`` alone and loaded the new scale with the old spread.
"""

from __future__ import annotations

import json
import threading

from benchmarks.loadgen import load
from bubblecast.serve.predictor import Predictor
from tests.serve.conftest import fake_server
from tests.serve.fakes import forecast_request, load_fake, slow_copy, write_model_dir

TOTAL = 3_000


def _answer(model_dir, body: bytes) -> dict:
    return json.loads(Predictor.from_source(str(model_dir), loader=load_fake).forecast_json(
        json.loads(body)))


def test_a_slow_copy_under_load_gives_no_mixed_answer(tmp_path):
    served = write_model_dir(tmp_path / "served", scale=1.0, spread=0.1, name="fake")
    new = write_model_dir(tmp_path / "new", scale=2.0, spread=0.3, name="fake")
    body = json.dumps(forecast_request(steps=3)).encode()
    old_answer, new_answer = _answer(served, body), _answer(new, body)
    assert old_answer != new_answer
    counts = {"old": 0, "new": 0, "mixed": 0}
    mixed: list[dict] = []
    lock = threading.Lock()
    copier = threading.Thread(target=slow_copy, args=(new, served, 0.1))

    def make(i: int) -> tuple[str, str, bytes]:
        if i == 300:
            copier.start()
        return "POST", "/v1/forecast", body

    def check(status: int, payload: bytes) -> bool:
        if status != 200:
            return False
        out = json.loads(payload)
        kind = "old" if out == old_answer else "new" if out == new_answer else "mixed"
        with lock:
            counts[kind] += 1
            if kind == "mixed" and len(mixed) < 3:
                mixed.append(out)
        return True

    with fake_server(served, watch=0.05) as (port, _):
        result = load("127.0.0.1", port, make, total=TOTAL, concurrency=8, rate=1000.0,
                      time_limit_s=120, check=check)
    copier.join(timeout=30)
    assert result.errors == [] and result.completed == TOTAL
    assert counts["mixed"] == 0, (counts, mixed)
    assert counts["old"] >= 300 and counts["new"] > 0, counts  # the swap happened under load
    print(f"hot swap: {counts}")
