"""A file the pipeline cannot write is named, with the reason (issue 38): our own runners say
"cannot write PATH: REASON" and exit CANNOT_WRITE, and run_tool reports that line, not a failure
of the tool or of the artifact (an IREE run used to be blamed on an "INCOMPATIBLE" artifact)."""
from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.core.tools import CANNOT_WRITE, python_module_argv, run_tool


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_runner_that_cannot_write_its_output_says_which_file_and_why(tmp_path):
    """The RKNN runner (no toolkit needed: it hands over the compile step's files) given an
    output in a folder that does not exist."""
    artifact, x, sim = tmp_path / "model.rknn", tmp_path / "x.npy", tmp_path / "simulated_0.npy"
    artifact.write_bytes(b"rknn")
    np.save(x, np.zeros(3, np.float32))
    np.save(sim, np.ones(3, np.float32))
    (tmp_path / "compile.json").write_text(json.dumps({"sha256": _sha(artifact), "simulated": {
        "inputs": [{"sha256": _sha(x)}], "outputs": [{"file": sim.name, "sha256": _sha(sim)}]}}))
    out = tmp_path / "gone" / "actual_0.npy"
    argv = python_module_argv("pipeline.run.rknn_run", "--artifact", str(artifact), "--compile-json",
                              str(tmp_path / "compile.json"), "--input", str(x), "--output", str(out))
    where = dict(stage="validate", model="m", target="rk3588/npu")
    ran = run_tool(argv, log=tmp_path / "log", what="running the NPU artifact", check=False, **where)
    assert ran.returncode == CANNOT_WRITE
    assert ran.output.strip() == f"cannot write {out}: No such file or directory"
    with pytest.raises(PipelineError) as info:
        run_tool(argv, log=tmp_path / "log", what="running the NPU artifact",
                 hint="an INCOMPATIBLE error means ...", **where)
    text = info.value.render()
    assert text.splitlines()[0] == (f"[model=m target=rk3588/npu stage=validate] running the NPU "
                                    f"artifact: cannot write {out}: No such file or directory; "
                                    f"the step's outputs were not published")
    assert "INCOMPATIBLE" not in text and "Traceback" not in text
    assert "next: make that folder writable" in text


def test_a_tool_exiting_so_without_the_line_is_still_the_tools_failure(tmp_path):
    with pytest.raises(PipelineError, match=r"tool failed \(exit code 73\)"):
        run_tool([sys.executable, "-c", "import sys; print('other'); sys.exit(73)"],
                 log=tmp_path / "log", what="tool")
