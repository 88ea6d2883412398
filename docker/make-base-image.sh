#!/usr/bin/env bash
# Make the offline builder base image from a Debian root filesystem: debootstrap + docker import.
#
# Used where no image registry can be reached (CI, air-gapped builders). The root filesystem
# tarball is cached, so a second run (or a fresh docker engine) only re-imports it.
# The Python twin of this script is factory.toolchain.images.ensure_base_image ('factory image base');
# both use the same packages and the same cache file.
#
# usage: docker/make-base-image.sh [NAME] [SUITE]
#   NAME   image name (default factory-base:bookworm)
#   SUITE  Debian suite (default bookworm)
# env: FACTORY_WORK_DIR (default .cache/factory/work): the tarball goes to $FACTORY_WORK_DIR/images/
#      DEBIAN_MIRROR (default http://deb.debian.org/debian)
set -euo pipefail

name="${1:-factory-base:bookworm}"
suite="${2:-bookworm}"
work="${FACTORY_WORK_DIR:-.cache/factory/work}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Keep in sync with factory/toolchain/images.py BASE_PACKAGES.
packages="python3,python3-venv,python3-dev,python3-pip,g++,make,ca-certificates,ccache"
key="$(echo "$packages" | sha256sum | cut -c1-12)"
label="org.factory.base-packages"

need() { command -v "$1" >/dev/null 2>&1 || { echo "ERROR $1 is not installed ($2)" >&2; exit 14; }; }
need docker "apt-get install docker.io"
need debootstrap "apt-get install debootstrap"
docker info >/dev/null 2>&1 || { echo "ERROR the docker engine is not running (start dockerd)" >&2; exit 14; }

# An image made from an older package set (its label says which) is made again.
if docker image inspect "$name" >/dev/null 2>&1; then
    have="$(docker image inspect -f "{{ index .Config.Labels \"$label\" }}" "$name" 2>/dev/null || true)"
    if [ "$have" = "$key" ]; then
        echo "+ image $name exists"
        exit 0
    fi
    echo "+ image $name was made from an older package set: making it again"
fi

mkdir -p "$work/images"
tarball="$work/images/rootfs-$suite-$key.tar"
if [ ! -s "$tarball" ]; then
    root="$(mktemp -d "$work/images/rootfs.XXXXXX")"
    trap 'rm -rf "$root"' EXIT
    echo "+ debootstrap --variant=minbase --include=$packages $suite $root $mirror"
    debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" \
        > "$work/images/debootstrap-$suite.log" 2>&1 \
        || { tail -n 50 "$work/images/debootstrap-$suite.log" >&2; exit 1; }
    # apt lists and caches are 100+ MB that no build needs.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    echo "+ tar -C $root -c . > $tarball"
    tar -C "$root" -c . > "$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
fi
echo "+ docker import $tarball $name"
docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    --change "LABEL $label=$key" "$tarball" "$name" >/dev/null
echo "+ image $name ready"
