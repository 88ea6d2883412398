#!/usr/bin/env bash
# Prepare a fresh Debian/Ubuntu builder host (as root): the docker engine, debootstrap, the
# factory itself (in a venv, docker/install-factory.sh), the offline base image, the glibc sysroot,
# and the wheelhouse for the bundled example cell.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=docker/apt-wait.sh
source docker/apt-wait.sh

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
# The index's finder page is tested in a real headless browser (tests/test_finder.py).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# aarch64 cells: qemu-user runs the target's Python for the import check (binfmt_misc lets an
# arm64 container run too); the cross compiler itself goes into the builder image, not here.
command -v qemu-aarch64-static >/dev/null 2>&1 || need_apt+=(qemu-user-static)
command -v update-binfmts >/dev/null 2>&1 || need_apt+=(binfmt-support)
# The Slurm test runs a real single-node cluster (tests/slurm_fixtures.py starts and stops its
# own munged, slurmctld and slurmd; nothing here starts them).
command -v slurmctld >/dev/null 2>&1 || need_apt+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need_apt+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need_apt+=(slurm-client)
command -v munged >/dev/null 2>&1 || need_apt+=(munge)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== apt-get install ${need_apt[*]}"
  apt_get update -qq
  apt_get install -y -qq "${need_apt[@]}"
fi

if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
fi
if [ -e /proc/sys/fs/binfmt_misc/register ] && ! grep -qs enabled /proc/sys/fs/binfmt_misc/qemu-aarch64; then
  echo "== binfmt_misc: qemu-aarch64"
  update-binfmts --enable qemu-aarch64 || echo "WARNING binfmt_misc for qemu-aarch64 is off: arm64 containers will not run"
fi

if ! docker info >/dev/null 2>&1; then
  echo "== starting dockerd"
  mkdir -p /var/log
  nohup dockerd >/var/log/factory-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "ERROR dockerd did not start; see /var/log/factory-dockerd.log" >&2; exit 1; }
fi

# The project goes into its own venv (a stock Debian/Ubuntu python3 refuses system installs);
# `factory` is linked into /usr/local/bin, and the tests run with "$venv/bin/python".
bash docker/install-factory.sh
factory="${FACTORY_VENV:-$(pwd)/.venv}/bin/factory"

echo "== base image"
"$factory" image base

echo "== glibc sysroot (bullseye: glibc 2.31, libstdc++ 10; the default cells' manylinux_2_28)"
"$factory" image sysroot

echo "== wheelhouse and toolkit for the example cell"
"$factory" wheelhouse factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311
"$factory" wheelhouse factory-example-ext-0.1.0-torch2.14.1-cu130-sm100-cp311-aarch64
