"""One torch thread for these tests: the tiny models are so small that thread synchronisation dominates on a busy
2-core machine (generating 12 completions took 4.6 s with 2 threads, 0.13 s with 1)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
