"""`doit tune executor=dask`: MetaSchedule's candidate builds on the workers of a Dask cluster
(`ClusterBuilds`, in the tuning child) and the function a worker runs for one (`remote_build`).
"""
from __future__ import annotations

import hashlib
import importlib
import math
import shutil
import time
from pathlib import Path

import tvm
from tvm.ir.utils import derived_object
from tvm.runtime import load_param_dict, save_param_dict
from tvm.s_tir import meta_schedule as ms

from ..core.errors import PipelineError
from .tvm_candidates import build_candidate, export_aarch64, export_host
from .tvm_tuning import BUILDER_TIMEOUT_S, PROGRESS


def remote_build(mod_json: str, target_json: str, params: bytes | None, cross: bool) -> dict:
    """One candidate build on a Dask worker (`doit tune executor=dask`): what LocalBuilder's
    worker process does here (build_candidate, then the export), returning the library's bytes.
    A candidate that does not build is a failed trial, as with LocalBuilder: its error is
    returned, not raised."""
    try:
        built = build_candidate(tvm.ir.load_json(mod_json), tvm.ir.load_json(target_json),
                                load_param_dict(bytearray(params)) if params else None)
        path = Path(export_aarch64(built) if cross else export_host(built))
        data = path.read_bytes()
        shutil.rmtree(path.parent, ignore_errors=True)
        return {"artifact": data, "error": None}
    except Exception as exc:  # noqa: BLE001 (LocalBuilder records any build failure as the trial's)
        return {"artifact": None, "error": f"{type(exc).__name__}: {exc}"}


class ClusterBuilds:
    """`doit tune executor=dask`: MetaSchedule's candidate builds go to the admitted workers of a
    Dask cluster (core/dask_executor.py: same code and tools as here), as many at once as there
    are workers; the measuring (LocalRunner here, or the boards of the RPC tracker) and the
    working database stay on this machine, the only writer of the records.

    A candidate travels as TVM's JSON of its IRModule and target (a few kB); the worker builds it
    with the function LocalBuilder calls here (build_candidate), exports a shared library (linked
    for aarch64 by the cross compiler, for boards) and returns its bytes, which are written under
    `folder` (a folder per candidate, which the runner removes once it is measured). Each build
    prints where it ran into the step's log. A worker killed mid-build: the scheduler gives the
    build to another worker. Every worker gone (or a build that killed three): `fatal` says so,
    and the tuning stops with that error; the trials already measured stay in the working
    database (the next `doit tune` resumes)."""

    def __init__(self, scheduler: str, cross: bool, folder: Path):
        from ..core import dask_executor  # imports distributed (1.2 s): only for a cluster
        self.dask, self.cross, self.folder = dask_executor, cross, folder
        self.cluster = dask_executor.Cluster(scheduler, name="modelyard-tune")
        self.tools = ("aarch64-linux-gnu-g++",) if cross else ("g++",)
        self.built_on: dict[str, int] = {}
        self.fatal: PipelineError | None = None
        self.where = {"stage": "tvm_tune"}
        if not self.cluster.able({}, self.tools):
            self.cluster.close()
            raise PipelineError(f"no admitted worker of the Dask cluster {scheduler} has "
                                f"{self.tools[0]}, which builds the tuning candidates",
                                hint="run ./setup.sh on the workers (it installs it), or tune "
                                     "with executor=local", **self.where)

    def builder(self):
        """The MetaSchedule builder object (a PyBuilder) that calls build()."""
        builds = self

        @derived_object
        class DaskBuilder(ms.builder.PyBuilder):
            def build(self, build_inputs):
                return builds.build(build_inputs)

        return DaskBuilder()

    def build(self, build_inputs: list) -> list:
        try:
            return [ms.builder.BuilderResult(path, error) for path, error in self._build(build_inputs)]
        except PipelineError as err:   # MetaSchedule would pass it on as a bare RuntimeError
            self.fatal = err
            raise

    def _build(self, build_inputs: list) -> list[tuple[str | None, str | None]]:
        this = importlib.import_module(__spec__.name if __spec__ else __name__)  # never __main__
        able = self.cluster.able({}, self.tools)
        if not able:
            raise PipelineError(f"no worker of the Dask cluster {self.cluster.scheduler} that could "
                                f"build tuning candidates is left", hint="start workers again "
                                "(docs/cluster.md) and run `doit tune` again: it resumes from the "
                                "trials measured so far", **self.where)
        started = time.monotonic()
        # a batch of builds waits for the slowest worker's share, each build within the timeout
        deadline = started + BUILDER_TIMEOUT_S * math.ceil(len(build_inputs) / len(able))
        jobs = []
        for one in build_inputs:
            mod, target = tvm.ir.save_json(one.mod), tvm.ir.save_json(one.target)
            params = bytes(save_param_dict(one.params)) if one.params is not None else None
            digest = hashlib.sha256("\0".join((mod, target, str(self.cross))).encode()
                                    + (params or b"")).hexdigest()
            jobs.append((digest, self.cluster.client.submit(
                self.dask.run_call, f"tvm_tune candidate {digest[:12]}", this.remote_build, mod,
                target, params, self.cross, key=f"modelyard-tune-build-{digest}", workers=able,
                allow_other_workers=False, pure=False)))
        out, batch = [], {}
        for digest, future in jobs:
            what = f"the tuning candidate build {digest[:12]}"
            try:
                done = self.cluster.wait(future, {}, self.where, what=what, tools=self.tools,
                                         deadline=deadline)
            finally:
                future.release()
            if done is None:
                print(f"candidate {digest[:12]}: not built within {BUILDER_TIMEOUT_S} s on the "
                      f"cluster", flush=True)
                out.append((None, f"DaskBuilder: not built within {BUILDER_TIMEOUT_S} s"))
                continue
            name, result = done["worker_name"], done["value"]
            batch[name] = batch.get(name, 0) + 1
            print(f"candidate {digest[:12]} built on dask worker {name} ({done['worker']}, host "
                  f"{done['host']}) in {done['finished'] - done['started']:.1f} s"
                  + (f": {result['error'].splitlines()[0][:200]}" if result["error"] else ""), flush=True)
            if result["error"]:
                out.append((None, f"DaskBuilder on worker {name}: {result['error']}"))
                continue
            path = self.folder / digest / "candidate.so"  # a folder each: the runner removes it
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(result["artifact"])
            out.append((str(path), None))
        for name, n in batch.items():
            self.built_on[name] = self.built_on.get(name, 0) + n
        print(f"{PROGRESS}built {len(build_inputs)} candidates on dask workers "
              + ", ".join(f"{w} ({n})" for w, n in sorted(batch.items()))
              + f" in {time.monotonic() - started:.1f} s", flush=True)
        return out

    def describe(self) -> dict:
        """What tune.json records of the builds: where they ran."""
        return {"kind": "dask", "scheduler": self.cluster.scheduler,
                "built_on": dict(sorted(self.built_on.items()))}

    def close(self) -> None:
        self.cluster.close()
