#!/usr/bin/env bash
# Install this project into its own virtual environment and put `factory` on the PATH.
#
# A stock Debian 12 / Ubuntu 24.04 python3 refuses `pip install` into the system
# (externally-managed-environment, PEP 668), so the factory gets a venv of its own:
#   FACTORY_VENV    where the venv goes (default: .venv in the repository)
#   FACTORY_EXTRAS  the extras to install (default: test; empty for the runtime only)
#   FACTORY_BIN_DIR where the `factory` link goes (default: /usr/local/bin; skipped if not writable)
#   FACTORY_PYTHON  the interpreter the venv is made from (default: python3; >= requires-python)
# pip's own variables apply (PIP_INDEX_URL, PIP_NO_INDEX, PIP_FIND_LINKS for an offline host).
# Idempotent: a second run reuses the venv and only re-installs the project.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
venv=${FACTORY_VENV:-$repo/.venv}
extras=${FACTORY_EXTRAS-test}
bin_dir=${FACTORY_BIN_DIR:-/usr/local/bin}
python=${FACTORY_PYTHON:-python3}

# The interpreter must meet requires-python (the workflows use the runner's python3): say so in
# one line instead of failing somewhere inside pip.
floor=$(sed -n 's/^requires-python = ">=\([0-9.]*\)".*/\1/p' pyproject.toml)
if ! "$python" -c "import sys; sys.exit(sys.version_info[:2] < tuple(map(int, '$floor'.split('.'))))" 2>/dev/null; then
  have=$("$python" --version 2>/dev/null || echo "not runnable")
  echo "ERROR $python is $have; the factory needs Python >= $floor (set FACTORY_PYTHON)" >&2
  exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
  # Debian and Ubuntu ship venv's ensurepip in a separate package (python3-venv).
  if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "== apt-get install python3-venv"
    # shellcheck source=docker/apt-wait.sh
    source docker/apt-wait.sh
    apt_get update -qq
    apt_get install -y -qq python3-venv
  fi
  echo "== venv $venv ($("$python" --version 2>&1))"
  "$python" -m venv "$venv"
fi

# The venv starts with the pip that this Python bundles (23.x for 3.11): too old for what the
# tests check of pip (metadata-only resolution), and older than what hosts run.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip

spec="."
[ -n "$extras" ] && spec=".[$extras]"
echo "== $venv/bin/pip install -e $spec"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$spec"

if mkdir -p "$bin_dir" 2>/dev/null && [ -w "$bin_dir" ]; then
  ln -sfn "$venv/bin/factory" "$bin_dir/factory"
  echo "== $bin_dir/factory -> $venv/bin/factory"
else
  echo "== $bin_dir is not writable: add $venv/bin to PATH to run factory"
fi
