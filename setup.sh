#!/usr/bin/env bash
# Set up a fresh Debian machine for modelyard (run as root; idempotent: a second run changes nothing).
#   1. system packages: qemu-user-static and the aarch64 C/C++ runtime (to run aarch64 artifacts),
#      Mesa lavapipe + the Vulkan loader (headless Vulkan), Chromium (the bench report's render
#      test runs it headless), python3-venv when missing;
#   2. a virtual environment .venv with the Python packages pinned in pyproject.toml;
#   3. the aarch64 IREE runtime of the same version, unpacked into .tools/ (run under qemu-user).
set -euo pipefail
cd "$(dirname "$0")"

say() { printf 'setup: %s\n' "$*"; }

# --- 1. system packages ------------------------------------------------------------------
APT_PACKAGES=(qemu-user-static libc6-arm64-cross libstdc++6-arm64-cross libgcc-s1-arm64-cross
              mesa-vulkan-drivers libvulkan1 vulkan-tools unzip chromium)
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

say "ready: $(.venv/bin/python --version), iree $version, $(qemu-aarch64-static --version | head -1)"
