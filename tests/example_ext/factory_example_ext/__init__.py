"""Elementwise CUDA kernels; importing needs no GPU, calling them does.

The compiled library has no Python module init (no Python headers: its objects do not depend on
the Python version); loading it registers the operators with torch's dispatcher.
"""

from pathlib import Path

import torch

(_library,) = Path(__file__).parent.glob("_C.*.so")
torch.ops.load_library(str(_library))

add = torch.ops.factory_example_ext.add
scale = torch.ops.factory_example_ext.scale
relu = torch.ops.factory_example_ext.relu
square = torch.ops.factory_example_ext.square

__all__ = ["add", "scale", "relu", "square"]
