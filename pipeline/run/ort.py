"""onnxruntime, the reference runtime: the sessions every stage opens on it, set up in one place.

Single-threaded CPU sessions, so that golden outputs are reproducible run to run.
"""
from __future__ import annotations

from pathlib import Path


def session(path: Path):
    """A single-threaded onnxruntime CPU session: the reference, reproducible run to run."""
    import onnxruntime as ort  # onnxruntime: 0.2 s, not needed by doit list
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def reduced_session(model):
    """onnxruntime CPU, one thread, no graph optimisation: the reduced graph as written."""
    import onnxruntime as ort  # onnxruntime: 0.2 s, not needed by doit list
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, sess_options=opts, providers=["CPUExecutionProvider"])


def variant_feeds(sample: dict, io_dtype: str) -> dict:
    """A sample (fp32 model inputs) as the variant takes it (float16 for io_dtype float16)."""
    import numpy as np  # numpy: 0.2 s, not needed by doit list
    if io_dtype != "float16":
        return sample
    return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in sample.items()}


# ----------------------------------------------------------------------------- the gate
