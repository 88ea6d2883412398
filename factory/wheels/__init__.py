"""Stage 5, the wheel: tag, pin and repair a raw wheel (``finalize``), check it (``verify``)
and record where it came from (``provenance``)."""
