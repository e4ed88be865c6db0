"""pyro_whvi: structured variational inference for over-parameterized Pyro and GPyTorch models.

The foundation is :mod:`pyro_whvi.ops`, the fast Walsh–Hadamard transform and the fused WHVI
product with compiled CPU kernels and a pure-PyTorch reference.
"""

from . import ops

__version__ = "0.1.0.dev0"

__all__ = ["__version__", "ops"]
