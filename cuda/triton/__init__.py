"""GPU kernels in Triton (installed as ``pyro_whvi._csrc.triton``); imported only when a CUDA tensor needs them."""
