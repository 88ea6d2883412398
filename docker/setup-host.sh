#!/usr/bin/env bash
# Prepare a fresh Debian/Ubuntu builder host (as root): the docker engine, debootstrap, the
# factory itself (in a venv, docker/install-factory.sh), the offline base image, the glibc sysroot,
# and the wheelhouse for the bundled example cell.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
# The index's finder page is tested in a real headless browser (tests/test_finder.py).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
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
