#!/usr/bin/env bash
# Install this project into its own virtual environment and put `factory` on the PATH.
#
# A stock Debian 12 / Ubuntu 24.04 python3 refuses `pip install` into the system
# (externally-managed-environment, PEP 668), so the factory gets a venv of its own:
#   FACTORY_VENV    where the venv goes (default: .venv in the repository)
#   FACTORY_EXTRAS  the extras to install (default: test; empty for the runtime only)
#   FACTORY_BIN_DIR where the `factory` link goes (default: /usr/local/bin; skipped if not writable)
# pip's own variables apply (PIP_INDEX_URL, PIP_NO_INDEX, PIP_FIND_LINKS for an offline host).
# Idempotent: a second run reuses the venv and only re-installs the project.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
venv=${FACTORY_VENV:-$repo/.venv}
extras=${FACTORY_EXTRAS-test}
bin_dir=${FACTORY_BIN_DIR:-/usr/local/bin}
python=${FACTORY_PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  # Debian and Ubuntu ship venv's ensurepip in a separate package (python3-venv).
  if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "== apt-get install python3-venv"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
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
