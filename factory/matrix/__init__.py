"""Stage 1, the matrix: matrix.toml read and validated (``load``), expanded into cells
(``cell``), and the local version tag that names a cell's wheel (``tags``)."""
