"""What the public indexes say: torch's releases and CUDA builds, and the packages' releases.

The first stage of the flow: the matrix's tracking rules (``latest:2``, ``default``, ...) are
resolved against these facts, never against a hand-kept table. ``sources`` reads the indexes
(live, through the cache under the work dir, or from a recording), ``simple`` reads one
project's files from a PEP 691/503 page, ``wheel_metadata`` a wheel's core metadata (PEP 658,
else HTTP range requests into the wheel), ``read`` turns those into ``Facts`` (``facts``), and
``snapshot`` regenerates the shipped offline fallback from recorded responses.
"""

from __future__ import annotations
