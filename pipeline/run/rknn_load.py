"""The app-side loader of RKNN artifacts (`.rknn`; the RKNN backend's `app`): whether this machine
has a Rockchip NPU and the board runtime (librknnrt, through rknn-toolkit-lite2) to load one, and
the loaded model. The NPU is a device of its own: never emulated.
"""
from __future__ import annotations

from pathlib import Path

from .loader import Choice, Context

# Where the rknpu kernel driver shows itself on a Rockchip board (DRM or misc device, debugfs).
NPU_NODES = ("/dev/rknpu", "/sys/kernel/debug/rknpu", "/proc/device-tree/npu@fdab0000")


def why_no_npu() -> str | None:
    """None when this machine has a Rockchip NPU and the board runtime to load `.rknn` files;
    else why not, in one sentence."""
    nodes = [n for n in NPU_NODES if Path(n).exists()]
    if not nodes:
        return (f"this machine has no Rockchip NPU (none of {', '.join(NPU_NODES)} exists): "
                f"RKNN artifacts run on the board's NPU only")
    try:
        import rknnlite.api  # noqa: F401 (rknn-toolkit-lite2, the board-side Python API)
    except ImportError:
        return (f"an NPU is present ({nodes[0]}) but rknn-toolkit-lite2 is not installed "
                f"(pip install rknn-toolkit-lite2, and librknnrt.so of the version the "
                f"manifest's requires.librknnrt names)")
    return None


class RknnModule:
    """A `.rknn` loaded on the board's NPU through rknn-toolkit-lite2 (librknnrt): numpy in,
    numpy out."""

    def __init__(self, path: str):
        from rknnlite.api import RKNNLite  # RKNN-Toolkit-Lite2: on the board only, not needed by doit list
        self._rknn = RKNNLite(verbose=False)
        for what, ret in (("load_rknn", lambda: self._rknn.load_rknn(path)),
                          ("init_runtime", lambda: self._rknn.init_runtime())):
            code = ret()
            if code != 0:
                raise RuntimeError(f"RKNNLite.{what}({path}) returned {code}")

    def __call__(self, *inputs):
        return self._rknn.inference(inputs=list(inputs),
                                    data_format=["nchw" if x.ndim == 4 else None for x in inputs])


class RknnLoader:
    def why_not(self, art: dict, ctx: Context) -> str | None:
        return why_no_npu()

    def choice(self, abi: str, art: dict, path: Path, ctx: Context, considered: list) -> Choice:
        return Choice(abi, path, art["abi"]["backend"],
                      f"{art['abi']['target_platform']} NPU (librknnrt)", False, considered)

    def load(self, choice: Choice, art: dict, n_outputs: int, ctx: Context, where: dict):
        return RknnModule(str(choice.path))
