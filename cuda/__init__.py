"""C++/CUDA kernel sources (the checkout keeps them in the top-level ``cuda/``)."""
