"""Stage 4, the build: one cell driven through the stages (``pipeline``), with the compile
cache mounted into the runner (``compile_cache``) and shared through S3 (``remote_cache``).
The runners themselves live in ``factory.runners``."""
