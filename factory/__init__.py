"""A prebuilt CUDA wheel factory with its own private package index.

The data flows one way: matrix -> cell -> plan -> build -> wheel -> verify -> publish -> index.
"""

__version__ = "0.1.0"
