"""A model directory written by ``save_model`` carries its files' sha256 manifest: it loads back
the same, and the service's directory check (``serve.registry``) verifies it, refusing a
directory whose native file no longer matches (a copy in progress)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from bubblecast.errors import BubblecastError
from bubblecast.forecast.lgbm import LGBMForecaster
from bubblecast.forecast.modeldir import load_model, save_model
from bubblecast.serve.registry import ModelSource, directory_state
from tests.dataset.synth import make_events
from tests.forecast.conftest import SMALL


@pytest.fixture(scope="module")
def frames():
    from bubblecast.dataset import build_dataset

    train = build_dataset(make_events(runs=4, steps=80, stages=2, replicas=1, kind="mixed",
                                      seed=5), SMALL)[0]
    test = build_dataset(make_events(runs=1, steps=80, stages=2, replicas=1, kind="mixed",
                                     seed=9, prefix="held"), SMALL)[0]
    return train, test


def test_saved_model_round_trips_and_the_registry_verifies_its_manifest(frames, tmp_path):
    train, test = frames
    model = LGBMForecaster(n_estimators=20, early_stopping_rounds=5, seed=1).fit(train)
    d = save_model(model, tmp_path / "m")
    doc = json.loads((d / "model.json").read_text())
    assert doc["files"] and sorted(doc["sha256"]) == sorted(doc["files"])
    for name, hexdigest in doc["sha256"].items():
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == hexdigest
    back = load_model(d)
    np.testing.assert_array_equal(back.predict(test).to_numpy(), model.predict(test).to_numpy())

    state = directory_state(d)  # the manifest checks out
    assert state == directory_state(d)
    _, info = ModelSource(str(d)).load()  # and the service loads it
    assert info.source == str(d)

    victim = d / doc["files"][0]  # a native file of another version (a copy half done)
    victim.write_text(victim.read_text().replace("tree", "tree ", 1))
    with pytest.raises(BubblecastError, match=f"{doc['files'][0]} does not match model.json"):
        directory_state(d)
    with pytest.raises(BubblecastError, match="does not match"):
        ModelSource(str(d)).load()
