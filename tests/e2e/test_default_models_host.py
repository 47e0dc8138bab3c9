"""The README's build on the shipped default models, for this x86_64 host: every CPU ABI, IREE's
and TVM's, validated natively. A file of its own so that pytest-xdist (--dist loadfile) runs it
beside the rk3588 build of tests/e2e/test_default_models.py, not after it."""
from __future__ import annotations

from test_default_models import build_and_check


def test_default_models_build_and_validate_for_the_host(tmp_path):
    build_and_check(tmp_path, "host", "cpu-x86_64", emulated=False)
