"""Builder images: which base each one stands on and the platform tag its glibc allows."""

from __future__ import annotations

# The manylinux tag follows the glibc of the build image (auditwheel refuses anything lower).
IMAGE_PLATS = {
    "factory-base:bookworm": "manylinux_2_36_x86_64",  # Debian 12, glibc 2.36 (tests, offline)
    "quay.io/pypa/manylinux_2_28_x86_64": "manylinux_2_28_x86_64",
}


def plat_for_image(image: str) -> str:
    for prefix, plat in IMAGE_PLATS.items():
        if image.startswith(prefix):
            return plat
    if "manylinux_2_28" in image or "manylinux2_28" in image:
        return "manylinux_2_28_x86_64"
    return "manylinux_2_36_x86_64"
