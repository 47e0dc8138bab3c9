#!/usr/bin/env bash
# Set up a fresh Debian machine for modelyard (run as root; idempotent: a second run changes nothing).
#   1. system packages: qemu-user-static and the aarch64 C/C++ runtime (to run aarch64 artifacts),
#      Mesa lavapipe + the Vulkan loader (headless Vulkan), Chromium (the bench report's render
#      test runs it headless), python3-venv when missing;
#   2. a virtual environment .venv with the Python packages pinned in pyproject.toml;
#   3. the aarch64 IREE runtime of the same version, unpacked into .tools/ (run under qemu-user);
#   4. an aarch64 Python (Debian arm64 packages, unpacked: no dpkg state is touched) with the
#      aarch64 TVM wheel of the same version, in .tools/: runs TVM artifacts and the TVM RPC
#      server under qemu-user;
#   5. RKNN-Toolkit2 (the RK3588 NPU's converter and simulator) in its own venv, .tools/rknn-venv;
#   6. binfmt_misc with qemu-aarch64 registered (flag F), so that arm64 programs run directly and
#      inside an arm64 root filesystem (mmdebstrap, chroot): the Debian package test.
set -euo pipefail
cd "$(dirname "$0")"

say() { printf 'setup: %s\n' "$*"; }

# --- 1. system packages ------------------------------------------------------------------
APT_PACKAGES=(qemu-user-static libc6-arm64-cross libstdc++6-arm64-cross libgcc-s1-arm64-cross
              mesa-vulkan-drivers libvulkan1 vulkan-tools unzip chromium
              gcc-aarch64-linux-gnu g++-aarch64-linux-gnu   # TVM cross-compiles aarch64 .so files
              nginx    # the remote cache tests' server: Debian's nginx has WebDAV PUT built in
              patch pkg-config   # the C runtime: the upstream IREE fix applied at build time; its .pc file tested
              mmdebstrap arch-test lintian)  # the .deb test: an arm64 Debian root filesystem; lintian on the packages
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$(command -v "$candidate"); break; fi
  done
fi
[ -n "$PYTHON" ] || { echo "setup: no python3 found; install Python 3.10-3.12 first" >&2; exit 1; }
"$PYTHON" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)' || {
  echo "setup: $PYTHON is $("$PYTHON" --version 2>&1); modelyard needs Python 3.10-3.12 (IREE wheels)" >&2; exit 1; }
"$PYTHON" -c 'import ensurepip' 2>/dev/null || APT_PACKAGES+=(python3-venv)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  say "installing system packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- 2. Python packages --------------------------------------------------------------------
stamp=.venv/.modelyard-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing Python packages (pyproject.toml)"
  log=.venv/pip-install.log
  { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip &&
    .venv/bin/python -m pip install --disable-pip-version-check -e '.[test]'; } >"$log" 2>&1 ||
    { tail -40 "$log" >&2; echo "setup: pip install failed; full log: $log" >&2; exit 1; }
  echo "$want" > "$stamp"
fi

# --- 3. aarch64 IREE runtime -----------------------------------------------------------------
version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("iree-base-runtime"))')
dest=.tools/iree-base-runtime-$version-aarch64
if [ ! -x "$dest/iree/_runtime_libs/iree-run-module" ]; then
  say "fetching the aarch64 iree-base-runtime $version wheel"
  tmp=$(mktemp -d .tools.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --platform manylinux_2_28_aarch64 --python-version 3.11 \
      "iree-base-runtime==$version" -d "$tmp/wheel" 2>"$tmp/pip.log" ||
    { cat "$tmp/pip.log" >&2; echo "setup: cannot download the aarch64 runtime wheel" >&2; exit 1; }
  .venv/bin/python -m zipfile -e "$tmp"/wheel/*.whl "$tmp/unpacked"
  chmod +x "$tmp"/unpacked/iree/_runtime_libs/iree-*
  mkdir -p .tools && rm -rf "$dest" && mv "$tmp/unpacked" "$dest"
fi

# --- 4. aarch64 Python + TVM (TVM artifacts and the TVM RPC server under qemu-user) -------------
pyver() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
tvm_version=$(pyver apache-tvm)
tvm_dest=.tools/tvm-$tvm_version-aarch64
if [ ! -x "$tvm_dest/python" ] || [ ! -d "$tvm_dest/site/tvm" ]; then
  say "fetching an aarch64 Python 3.11 (Debian arm64 packages) and the aarch64 apache-tvm $tvm_version wheel"
  ttmp=$(mktemp -d .tools.XXXXXX)
  trap 'rm -rf "${tmp:-}" "$ttmp"' EXIT
  mkdir -p "$ttmp/apt/lists/partial" "$ttmp/apt/cache/archives/partial" && touch "$ttmp/apt/status"
  apt_arm64=(-o APT::Architecture=arm64 -o APT::Architectures=arm64 -o Debug::NoLocking=1
             -o Dir::State::Lists="$PWD/$ttmp/apt/lists" -o Dir::Cache="$PWD/$ttmp/apt/cache"
             -o Dir::State::status="$PWD/$ttmp/apt/status")
  { apt-get "${apt_arm64[@]}" update &&
    apt-get "${apt_arm64[@]}" install -d -y --no-install-recommends python3.11 libstdc++6; } \
      >"$ttmp/apt.log" 2>&1 || { tail -20 "$ttmp/apt.log" >&2; echo "setup: cannot fetch arm64 Python packages" >&2; exit 1; }
  mkdir -p "$ttmp/out/root"
  for deb in "$ttmp"/apt/cache/archives/*.deb; do dpkg-deb -x "$deb" "$ttmp/out/root"; done
  # the aarch64 wheels, at the versions this venv has (apache-tvm-ffi must match: see pyproject.toml)
  pins=()
  for dist in apache-tvm apache-tvm-ffi numpy ml_dtypes typing_extensions psutil cloudpickle tornado; do
    pins+=("$dist==$(pyver "$dist")")
  done
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --target "$ttmp/out/site" --implementation cp --python-version 3.11 --abi cp311 \
      --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
      "${pins[@]}" >"$ttmp/pip.log" 2>&1 ||
    { tail -20 "$ttmp/pip.log" >&2; echo "setup: cannot download the aarch64 TVM wheels" >&2; exit 1; }
  mkdir -p "$ttmp/out/sc"
  # TVM's RPC server re-executes sys.executable for its workers: make that this wrapper, not the
  # bare aarch64 binary (this machine cannot exec aarch64 binaries without qemu in front).
  printf '%s\n' 'import os, sys' \
    'sys.executable = os.environ.get("MODELYARD_AARCH64_PYTHON", sys.executable)' > "$ttmp/out/sc/sitecustomize.py"
  cat > "$ttmp/out/python" <<'WRAPPER'
#!/bin/sh
# The aarch64 Python of this folder under qemu-user (QEMU_CPU picks the CPU model, e.g. cortex-a76).
d=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
exec qemu-aarch64-static -L "$d/root" -U PYTHONHOME -E PYTHONNOUSERSITE=1 \
  -E PYTHONPATH="$d/sc:$d/site" -E MODELYARD_AARCH64_PYTHON="$d/python" "$d/root/usr/bin/python3.11" "$@"
WRAPPER
  chmod +x "$ttmp/out/python"
  mkdir -p .tools && rm -rf "$tvm_dest" && mv "$ttmp/out" "$tvm_dest"
fi

# --- 5. RKNN-Toolkit2 (the RK3588 NPU backend) in its own venv --------------------------------
# Its pins (numpy<=1.26.4, onnx<=1.18, protobuf<=4.25.4, torch<=2.4.0) clash with .venv's. The
# lightest install that works (docs/npu.md): the toolkit without its declared requirements, then
# what it imports: torch only at module load (no ONNX code path calls it), so the CPU torch wheel
# this machine keeps on disk (2.13.0+cpu; pip warns that it is outside the pin) instead of a 2.4
# build that pulls GBs of CUDA packages; opencv headless; onnxruntime (its ONNX checks run it);
# setuptools < 81 (it imports pkg_resources). pipeline/stages/rknn_compile.py runs it as a child.
RKNN_PINS=(rknn-toolkit2==2.5.0)
RKNN_DEPS=(numpy==1.26.4 onnx==1.18.0 protobuf==4.25.4 onnxruntime==1.19.2 torch==2.13.0
           scipy==1.17.1 psutil==7.2.2 ruamel.yaml==0.19.1 tqdm==4.70.1 fast-histogram==0.14
           opencv-python-headless==4.11.0.86 setuptools==80.9.0)
rknn_venv=.tools/rknn-venv
rknn_want=$(printf '%s\n' "$PYTHON" "${RKNN_PINS[@]}" "${RKNN_DEPS[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$rknn_venv/.modelyard-installed" 2>/dev/null)" != "$rknn_want" ]; then
  say "creating $rknn_venv (RKNN-Toolkit2 ${RKNN_PINS[0]#*==}, its own pins)"
  rm -rf "$rknn_venv" && mkdir -p .tools
  rlog=.tools/rknn-install.log
  { "$PYTHON" -m venv "$rknn_venv" &&
    "$rknn_venv/bin/python" -m pip install --disable-pip-version-check --no-deps "${RKNN_PINS[@]}" &&
    "$rknn_venv/bin/python" -m pip install --disable-pip-version-check "${RKNN_DEPS[@]}" &&
    "$rknn_venv/bin/python" -c 'from rknn.api import RKNN'; } >"$rlog" 2>&1 ||
    { tail -40 "$rlog" >&2; echo "setup: RKNN-Toolkit2 install failed; full log: $rlog" >&2; exit 1; }
  echo "$rknn_want" > "$rknn_venv/.modelyard-installed"
fi

# --- 6. binfmt_misc: arm64 programs run directly, in chroots too (tests/e2e/test_debian_packages.py) --
# qemu-user-static ships the registration line (/usr/lib/binfmt.d/qemu-aarch64.conf, flags OPF:
# F opens the interpreter now, so it works inside a chroot that has no qemu). Machines without
# systemd-binfmt (containers) neither mount binfmt_misc nor register it: done here, idempotently.
binfmt=/proc/sys/fs/binfmt_misc
binfmt_conf=/usr/lib/binfmt.d/qemu-aarch64.conf
binfmt_help="the Debian package test (tests/e2e/test_debian_packages.py) needs it: run setup.sh as root on a machine (or a --privileged container) that allows it, or register it on the host"
if [ ! -e "$binfmt/qemu-aarch64" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if [ ! -e "$binfmt/register" ] &&
     ! $SUDO mount -t binfmt_misc binfmt_misc "$binfmt" 2>/tmp/modelyard-binfmt.err; then
    say "WARNING: cannot mount binfmt_misc at $binfmt ($(cat /tmp/modelyard-binfmt.err 2>/dev/null)); $binfmt_help"
  elif [ ! -f "$binfmt_conf" ]; then
    say "WARNING: $binfmt_conf is missing (qemu-user-static without binfmt.d?); $binfmt_help"
  elif ! grep -v '^#' "$binfmt_conf" | $SUDO tee "$binfmt/register" >/dev/null 2>/tmp/modelyard-binfmt.err; then
    say "WARNING: cannot register qemu-aarch64 with binfmt_misc ($(cat /tmp/modelyard-binfmt.err 2>/dev/null)); $binfmt_help"
  else
    say "registered qemu-aarch64 with binfmt_misc (flags $(sed -n 's/^flags: //p' "$binfmt/qemu-aarch64"))"
  fi
fi
if [ -e "$binfmt/qemu-aarch64" ] && ! grep -q '^flags: .*F' "$binfmt/qemu-aarch64"; then
  say "WARNING: qemu-aarch64 is registered with binfmt_misc without flag F: chroots into an arm64 root filesystem fail; remove it (echo -1 > $binfmt/qemu-aarch64) and run setup.sh again"
fi

say "ready: $(.venv/bin/python --version), iree $version, tvm $tvm_version, rknn-toolkit2 ${RKNN_PINS[0]#*==}, $(qemu-aarch64-static --version | head -1)"
