r"""Variational layers: ``nn.Module`` s that hold their own posterior, the path ``torch.compile`` traces.

A structured guide (:class:`~pyro_whvi.AutoWHVIGuide`, :class:`~pyro_whvi.AutoVSDGuide`) transforms a
Pyro model; a variational layer is the explicit form of the same posterior family. Its variational
parameters are ordinary ``nn.Parameter`` s, ``forward`` draws the noise of every example (local
reparameterization) and :meth:`VariationalLayer.kl_divergence` is the layer's closed-form KL term.
It is plain PyTorch (no Pyro trace, no tensor subclass), so a whole ELBO loss

.. math:: \mathcal{L} = -\frac{N}{B} \sum_{n \in \text{batch}} \log p(y_n \mid f(x_n)) + \sum_\ell \mathrm{KL}_\ell

(:func:`kl_divergence` sums the layers' terms) goes through ``torch.compile(fullgraph=True)``; with
``options={"fallback_random": True}`` the compiled loss draws the same noise as eager PyTorch.

**Executions.** :func:`~pyro_whvi.nn.bayesian_` gives a model an *execution scope*: from the model's
call to its return, each layer draws the noise of an example once and every later use of the layer
reuses it (tied weights, unrolled loops); the next call draws anew. An example is an index along
``example_dim`` of a linear layer's input (0: the leading batch index; 1 for ``(T, B, D)`` inputs)
and an image of a convolution's batch. A layer outside any scope (called on its own) is its own
execution.

**In a Pyro model.** Called inside a Pyro model (``SVI``, ``Predictive``), a layer of a model that
went through :func:`~pyro_whvi.nn.bayesian_` registers its parameters with ``pyro.module`` (unless
``module_local_params`` is on, where Pyro's ``ELBOModule`` collects them) and adds
``pyro.factor("<layer>.kl", -KL)`` once per execution, so Pyro's ELBOs compute the same objective.
"""

from __future__ import annotations

import pyro
import torch
from pyro.distributions import constraints
from pyro.poutine.runtime import am_i_wrapped
from torch import Tensor, nn
from torch.distributions import biject_to
from torch.nn import functional as F

from ..distributions.qg_family import diagonal_normal_kl
from ..infer.lazy_weight import along_examples, check_example_dim, local_reparameterization_enabled

__all__ = ["ExecutionScope", "VariationalLayer", "kl_divergence", "normal_kl", "softplus_inverse"]


def softplus_inverse(value: Tensor) -> Tensor:
    """The unconstrained value whose softplus is ``value`` (the parameterization of every scale here)."""
    return biject_to(constraints.softplus_positive).inv(value)


#: :math:`\sum \mathrm{KL}(\mathcal{N}(\mu, \sigma^2) \,\Vert\, \mathcal{N}(0, \sigma_p^2))` in closed form:
#: the family's (:func:`pyro_whvi.distributions.qg_family.diagonal_normal_kl`), under the layers' name.
normal_kl = diagonal_normal_kl

#: The method that converts a module or tensor to a dtype, as the dtype-mismatch messages name it.
CONVERSIONS = {torch.float64: "double", torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat16"}


class ExecutionScope:
    """The noise the variational layers of one model drew in its current execution.

    Installed by :func:`~pyro_whvi.nn.bayesian_` as a forward pre-hook and an ``always_call`` forward
    hook of the model: ``depth`` counts the model's active calls and the noise is forgotten when the
    outermost returns (or raises).
    """

    def __init__(self) -> None:
        self.depth = 0
        self.noise: dict[str, Tensor] = {}
        self.registered: set[str] = set()
        self.handles: list = []

    def enter(self, module, args) -> None:
        if not self.depth:
            self.noise.clear()
            self.registered.clear()
        self.depth += 1

    def exit(self, module, args, output) -> None:
        self.depth -= 1
        if not self.depth:
            self.noise.clear()
            self.registered.clear()


class VariationalLayer(nn.Module):
    """Base of the variational layers: per-execution noise, a Bayesian bias, the Pyro registration.

    A subclass sets ``out_features`` and implements :meth:`kl_divergence` and ``forward``, drawing its
    noise with :meth:`linear_noise` / :meth:`image_noise` and calling :meth:`register_with_pyro`.

    :param example_dim: the dimension of a linear layer's input that indexes examples.
    """

    out_features: int
    bias_prior_scale: float

    def __init__(self, example_dim: int = 0):
        super().__init__()
        self.example_dim = check_example_dim(example_dim, type(self).__name__)
        self.execution: ExecutionScope | None = None
        self.execution_key = ""

    # -- bias: a mean-field Normal, as the structured guides give every bias site -----------------

    def init_bias(self, bias: bool, prior_scale: float, init_scale: float, like: Tensor) -> None:
        """``bias_loc`` (a draw from the prior) and ``bias_scale`` (``init_scale`` times the prior's), or none."""
        self.bias_prior_scale = float(prior_scale)
        if not bias:
            self.register_parameter("bias_loc", None)
            self.register_parameter("bias_scale_unconstrained", None)
            return
        loc = prior_scale * torch.randn(self.out_features, dtype=like.dtype, device=like.device)
        self.bias_loc = nn.Parameter(loc)
        self.bias_scale_unconstrained = nn.Parameter(softplus_inverse(torch.full_like(loc, init_scale * prior_scale)))

    @property
    def bias_size(self) -> int:
        """How many noise entries an example's bias takes (0 without a bias)."""
        return 0 if self.bias_loc is None else self.out_features

    def bias_sample(self, noise: Tensor) -> Tensor | None:
        """The bias for standard-normal ``noise`` ``(..., out_features)``; ``None`` for a layer without one."""
        if self.bias_loc is None:
            return None
        return self.bias_loc + F.softplus(self.bias_scale_unconstrained) * noise

    def bias_kl(self) -> Tensor | float:
        if self.bias_loc is None:
            return 0.0
        return normal_kl(self.bias_loc, F.softplus(self.bias_scale_unconstrained), self.bias_prior_scale)

    def kl_divergence(self) -> Tensor:
        """The layer's KL term, closed form (it does not depend on the noise)."""
        raise NotImplementedError

    # -- noise with the scope of one execution ------------------------------------------------------

    def draw_noise(self, count: int, size: int, like: Tensor) -> Tensor:
        """Standard-normal noise ``(count, size)``, drawn once per execution of the model, then reused."""
        scope = self.execution
        if scope is None or not scope.depth:
            return torch.randn(count, size, dtype=like.dtype, device=like.device)
        noise = scope.noise.get(self.execution_key)
        if noise is None:
            noise = torch.randn(count, size, dtype=like.dtype, device=like.device)
            scope.noise[self.execution_key] = noise
            return noise
        if noise.shape[0] != count:
            raise ValueError(
                f"{type(self).__name__} {self.execution_key!r}: this execution of the model drew noise for "
                f"{noise.shape[0]} examples and now calls the layer on {count}; every use within one execution "
                f"must see the same examples along example_dim={self.example_dim} (dim 0 of a convolution's input)."
            )
        return noise

    def local(self) -> bool:
        """Whether each example gets its own draw (``local_reparameterization(False)`` shares one)."""
        return torch.compiler.is_compiling() or local_reparameterization_enabled(True)

    def linear_noise(self, input: Tensor, size: int) -> Tensor:
        """Noise ``(..., size)`` for a linear layer's ``input`` ``(..., D_in)``, broadcasting over its batch dims."""
        if input.dim() == 1:
            return self.draw_noise(1, size, input)[0]
        if self.example_dim > input.dim() - 2:
            raise ValueError(
                f"{type(self).__name__}: example_dim={self.example_dim} but the input has only {input.dim() - 1} "
                f"batch dimension(s) (shape {tuple(input.shape)})."
            )
        count = input.shape[self.example_dim] if self.local() else 1
        return along_examples(self.draw_noise(count, size, input), self.example_dim, input.dim() - 1)

    def image_noise(self, images: Tensor, size: int) -> Tensor:
        """Noise ``(N or 1, size)`` for a batch of images ``(N, C, H, W)``: one draw per image."""
        return self.draw_noise(images.shape[0] if self.local() else 1, size, images)

    # -- inputs -------------------------------------------------------------------------------------

    def check_input_dtype(self, input: Tensor) -> None:
        """Refuse a floating input of another dtype than the layer's parameters, naming both and the fix."""
        dtype = next(self.parameters()).dtype
        if input.is_floating_point() and input.dtype != dtype:
            name = f"{type(self).__name__} {self.execution_key!r}" if self.execution_key else type(self).__name__
            to_input, to_layer = CONVERSIONS.get(input.dtype, "to"), CONVERSIONS.get(dtype, "to")
            raise TypeError(
                f"{name}: the input is {input.dtype} but the layer's parameters are {dtype}; convert the model with "
                f"model.{to_input}() or the data with x.{to_layer}()."
            )

    def check_linear_input(self, input: Tensor, in_features: int) -> None:
        if input.dim() < 1 or input.shape[-1] != in_features:
            raise ValueError(
                f"{type(self).__name__}: expected an input of shape (..., {in_features}), got {tuple(input.shape)}."
            )
        self.check_input_dtype(input)

    def convolve(self, input: Tensor, in_channels: int, convolution) -> Tensor:
        """``convolution(images) -> (output, bias)`` on ``(N, C, H, W)`` or unbatched ``(C, H, W)`` input."""
        if input.dim() not in (3, 4) or input.shape[-3] != in_channels:
            raise ValueError(
                f"{type(self).__name__}: expected images (N, {in_channels}, H, W) or ({in_channels}, H, W), "
                f"got {tuple(input.shape)}."
            )
        self.check_input_dtype(input)
        images = input if input.dim() == 4 else input.unsqueeze(0)
        output, bias = convolution(images)
        if bias is not None:
            output = output + bias[..., None, None]
        self.register_with_pyro()
        return output if input.dim() == 4 else output.squeeze(0)

    # -- Pyro ---------------------------------------------------------------------------------------

    def register_with_pyro(self) -> None:
        """Inside a Pyro model: ``pyro.module`` the parameters and add ``-KL`` as a factor, once per execution."""
        if torch.compiler.is_compiling() or not am_i_wrapped():
            return
        scope = self.execution
        if scope is None or not scope.depth:
            raise RuntimeError(
                f"{type(self).__name__} was called inside a Pyro model without an execution scope, so its KL term "
                "cannot be added once per model execution. Pass the network that holds it through "
                "pyro_whvi.nn.bayesian_(network) once (it also adopts layers you placed yourself)."
            )
        if self.execution_key in scope.registered:
            return
        scope.registered.add(self.execution_key)
        name = self.execution_key or "bayesian"
        if not pyro.settings.get("module_local_params"):
            pyro.module(name, self)
        pyro.factor(f"{name}.kl", -self.kl_divergence())


def kl_divergence(module: nn.Module) -> Tensor:
    """The sum of the KL terms of the variational layers in ``module`` (a shared layer counts once)."""
    terms = [layer.kl_divergence() for layer in module.modules() if isinstance(layer, VariationalLayer)]
    if not terms:
        raise ValueError(
            f"kl_divergence: {type(module).__name__} has no variational layer; build it from pyro_whvi.nn layers "
            "or convert it with pyro_whvi.nn.bayesian_(module)."
        )
    return torch.stack(terms).sum()
