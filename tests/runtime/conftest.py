"""Runtime tests: one intra-op thread (tiny models; on a shared 2-core machine more threads
only spin), as the workers use."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
