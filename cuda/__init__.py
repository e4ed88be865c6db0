"""Kernel sources (the checkout keeps them in the top-level ``cuda/``): ``cpu/`` C++, ``triton/`` GPU (see README.md)."""
