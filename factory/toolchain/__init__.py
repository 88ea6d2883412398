"""Stage 2, the toolchain: which nvcc matches torch's CUDA (``resolve``), a CUDA home from
NVIDIA's PyPI wheels (``toolkit``), the offline builder images (``images``, ``python_image``)
and the offline wheelhouse a build installs from (``wheelhouse``)."""
