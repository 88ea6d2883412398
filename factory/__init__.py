"""A prebuilt CUDA wheel factory with its own private package index.

The data flows one way: matrix -> cell -> plan -> build -> wheel -> verify -> publish -> index.
"""

from factory.matrix.cell import Cell
from factory.errors import FactoryError

__version__ = "0.1.0"
__all__ = ["Cell", "FactoryError", "__version__"]
