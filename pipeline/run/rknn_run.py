"""Validation's runner of RKNN artifacts (`.rknn`, Rockchip's NPU format): the simulator's outputs.

    python -m pipeline.run.rknn_run --artifact model.rknn --compile-json compile.json \
        --input x.npy ... --output y.npy ...

RKNN-Toolkit2's simulator runs only a model built in the same process, so the compile step
(pipeline/stages/rknn_compile.py) built, simulated on the golden inputs and exported in one child
process. This hands those simulated outputs to validation after checking that they belong to these
very bytes and inputs: the artifact's sha256 is the one the simulated model was exported as, and
each input is the file it was simulated on. Anything else is an error, never a silent pass. The
board's NPU never runs here; the app side (is an NPU present? load a `.rknn` on it) is rknn_load.py.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

FORMAT = "rknn"   # the manifest's `format` of RKNN artifacts
CANNOT_WRITE = 73  # core.tools.CANNOT_WRITE: an output file could not be written


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.run.rknn_run")
    parser.add_argument("--artifact", required=True)
    parser.add_argument("--compile-json", required=True)
    parser.add_argument("--input", action="append", default=[])
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    report = json.loads(Path(args.compile_json).read_text())
    sim = report["simulated"]
    folder = Path(args.compile_json).parent
    shipped = _sha256(Path(args.artifact))
    if shipped != report["sha256"]:
        print(f"{args.artifact} (sha256 {shipped}) is not the file the simulated model was "
              f"exported as ({report['sha256']})", file=sys.stderr)
        return 2
    given = [_sha256(Path(p)) for p in args.input]
    ran_on = [i["sha256"] for i in sim["inputs"]]
    if given != ran_on:
        print(f"the simulator ran on other inputs (sha256 {ran_on}) than validation's "
              f"({given})", file=sys.stderr)
        return 3
    if len(args.output) != len(sim["outputs"]):
        print(f"the simulator gave {len(sim['outputs'])} outputs, validation wants "
              f"{len(args.output)}", file=sys.stderr)
        return 4
    for out, entry in zip(args.output, sim["outputs"]):
        source = folder / entry["file"]
        if _sha256(source) != entry["sha256"]:
            print(f"{source} changed since the compile step wrote it", file=sys.stderr)
            return 5
        try:
            shutil.copyfile(source, out)
        except OSError as exc:  # not the artifact's failure: say which file, and why
            if Path(exc.filename or "") == Path(source):
                raise
            print(f"cannot write {exc.filename or out}: {exc.strerror}", file=sys.stderr)
            return CANNOT_WRITE
    print(json.dumps({"artifact_sha256": shipped, "outputs": len(args.output)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
