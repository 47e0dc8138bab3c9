"""Timing runs no runtime that spin-waits after a call: a spinning thread pool takes the CPUs from
whatever runs next, and the search and the bench run onnxruntime right after the artifacts. Before
this, TVM's pool spun in `doit search` and onnxruntime's ppocr_det p50 read 90 ms there, 62 ms
with the pool quiet (every ratio to onnxruntime looked better than it was)."""
from __future__ import annotations

import os

import pytest

from pipeline.run import tvm_run, tvm_timing
from pipeline.stages import choose


class FakeModule:
    def __init__(self, path, entry="main", threads=None):
        self.spin_at_load = os.environ.get("TVM_THREAD_POOL_SPIN_COUNT")

    def timed(self, inputs):
        return {"copy_in": 1, "invoke": 2, "read_back": 3}, []


@pytest.fixture
def fake_tvm(monkeypatch):
    monkeypatch.setattr(tvm_run, "TvmModule", FakeModule)
    monkeypatch.delenv("TVM_THREAD_POOL_SPIN_COUNT", raising=False)


def test_the_search_times_tvm_with_a_quiet_thread_pool(fake_tvm):
    runner = choose._runner({"format": "tvm-so", "path": "m.so", "entry": "main"}, 2)
    assert isinstance(runner, tvm_timing.TvmCpuRunner)
    assert runner.module.spin_at_load == "0"  # set before TVM's pool could start
    assert sum(runner([])[0].values()) == 6

