# %% [markdown]
# # WHVI on a PyroModule Bayesian network, from scratch
#
# Walsh–Hadamard Variational Inference (Rossi, Marmin and Filippone, NeurIPS 2020, §2) gives each
# `D x D` weight matrix the posterior `W = S1 H diag(g) H S2` with `g ~ N(mu, diag(sigma^2))`: a
# matrix-variate Gaussian with correlated entries, `O(D)` parameters and `O(D log D)` time through the
# fast Walsh–Hadamard transform `H`. In Pyro it is one guide: write the model as you always would, then
# swap `AutoNormal` for `AutoWHVIGuide`. Everything else (`SVI`, `Trace_ELBO`, `Predictive`, the
# param store) is Pyro's own.
#
# Run it as a script (`python tutorials/whvi_from_scratch.py`); `PYRO_WHVI_TUTORIAL_FAST=1` runs a
# short version (the test suite does) and `PYRO_WHVI_TUTORIAL_OUT` says where the figures go
# (default: `figures/` next to this file).

# %%
import itertools
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_sample
from pyro.nn import PyroModule, PyroSample
from pyro.optim import PyroOptim
from torch import nn

from pyro_whvi import AutoWHVIGuide
from pyro_whvi.data import TOY_GAP, toy_function, toy_regression_1d

FAST = os.environ.get("PYRO_WHVI_TUTORIAL_FAST") == "1"
OUT = Path(os.environ.get("PYRO_WHVI_TUTORIAL_OUT", Path(__file__).parent / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
STEPS = 40 if FAST else 4000
SAMPLES = 20 if FAST else 200  # posterior draws per band
pyro.set_rng_seed(0)

# %% [markdown]
# ## 1. The model: plain Pyro
#
# A 1 → 128 → 128 → 1 network with cosine activations (the WHVI paper's toy set-up, §3.1). Each layer
# is an `nn.Linear` turned into a `PyroModule` whose weight and bias are `PyroSample` priors. The
# weight prior is declared as **one event** (`.to_event(2)`): the whole matrix is one latent site,
# which is what a matrix-variate guide needs. Nothing here knows about WHVI.

# %%


class BNN(PyroModule):
    def __init__(self, widths=(1, 128, 128, 1), noise_scale=0.22):
        super().__init__()
        layers = []
        for d_in, d_out in itertools.pairwise(widths):
            layer = PyroModule[nn.Linear](d_in, d_out)
            layer.weight = PyroSample(dist.Normal(0.0, d_in**-0.5).expand([d_out, d_in]).to_event(2))
            layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([d_out]).to_event(1))
            layers.append(layer)
        self.layers = PyroModule[nn.ModuleList](layers)
        self.noise_scale = noise_scale

    def forward(self, x, y=None):
        h = x
        for k, layer in enumerate(self.layers):
            h = layer(h)
            if k < len(self.layers) - 1:
                h = torch.cos(h)
        f = pyro.deterministic("f", h.squeeze(-1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, self.noise_scale), obs=y)
        return f


x, y = toy_regression_1d(128)  # 128 points on [-1, 2] with a gap
grid = torch.linspace(-1.5, 2.5, 200).unsqueeze(-1)

# %% [markdown]
# ## 2. Swap one guide
#
# `AutoWHVIGuide(model)` puts every weight matrix with both sides > 1 (here the 128 x 128 layer; the
# 128 x 1 and 1 x 128 ones are vectors) under WHVI and gives the other sites a mean-field Normal.
# `expose="all"` also puts vectors under WHVI, reshaped onto a square block (§2.5): that is what we
# use on this toy problem. The guide transforms the model in place (forward hooks on the module), so
# the same `model` goes to `SVI` and `Predictive`. Since `model` then carries the WHVI transformation,
# the mean-field comparison gets a fresh `BNN()`.

# %%


def train(model, guide, steps=STEPS):
    svi = SVI(model, guide, PyroOptim(torch.optim.Adam, {"lr": 0.01}), Trace_ELBO())
    return [svi.step(x, y) for _ in range(steps)]


def band(model, guide, samples=SAMPLES):
    """Mean and sd of f on the grid, from Pyro's Predictive."""
    with torch.no_grad():
        f = Predictive(model, guide=guide, num_samples=samples, return_sites=["f"])(grid)["f"]
    f = f.reshape(samples, -1)
    return f.mean(0), f.std(0)


pyro.clear_param_store()
model = BNN()
whvi = AutoWHVIGuide(model, expose="all")  # transforms `model` in place
whvi_losses = train(model, whvi)
bands = {"WHVI": band(model, whvi)}
whvi_store = pyro.get_param_store().get_state()  # the trained guide lives in Pyro's param store

pyro.clear_param_store()
mean_field_model = BNN()  # untransformed: `model` now carries the WHVI guide
mean_field = AutoNormal(mean_field_model, init_loc_fn=init_to_sample, init_scale=0.01)  # start at a prior draw
mean_field_losses = train(mean_field_model, mean_field)
bands["mean field (AutoNormal)"] = band(mean_field_model, mean_field)


def count(guide):
    return sum(p.numel() for p in guide.parameters())


print(f"variational parameters: WHVI {count(whvi):,}, mean field {count(mean_field):,}")

# %% [markdown]
# WHVI has 770 variational parameters where the mean field has 33,794 (printed above): 44 times
# fewer, for a posterior that, unlike the mean field, correlates the entries of each weight matrix.
#
# ## 3. The predictive bands
#
# `band` above used Pyro's `Predictive`. With local reparameterization (the default) `F.linear`
# draws `g` per example inside the transformed model, so `Predictive` works as usual. A good
# posterior's band widens in the gap (shaded), where there are no data.

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
for ax, (name, (mean, std)) in zip(axes, bands.items()):
    ax.axvspan(*TOY_GAP, color="0.92")
    ax.fill_between(grid[:, 0], mean - 2 * std, mean + 2 * std, alpha=0.3, label="±2 sd of f")
    ax.plot(grid[:, 0], mean, label="mean")
    ax.plot(grid[:, 0], toy_function(grid[:, 0]), "k--", lw=1, label="truth")
    ax.scatter(x[:, 0], y, s=5, color="C3")
    ax.set(ylim=(-3, 3), title=name)
axes[0].legend(loc="lower left", fontsize=8)
axes[2].plot(whvi_losses, label="WHVI")
axes[2].plot(mean_field_losses, label="mean field")
axes[2].set(yscale="log", xlabel="SVI step", ylabel="-ELBO", title="training")
axes[2].legend()
fig.tight_layout()
fig.savefig(OUT / "whvi_from_scratch_bands.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ![bands](figures/whvi_from_scratch_bands.png)
#
# ## 4. Look inside the posterior
#
# `guide.weight_distribution(site)` is `q(W)` for one weight site: its mean and variance, the
# covariance of `vec(W)` (§2.2: a matrix-variate Gaussian) and samples. Its moments follow the
# paper's formulas; here we check the mean and variance against samples.

# %%
pyro.get_param_store().set_state(whvi_store)
q_w = whvi.weight_distribution("layers.1.weight")
samples = q_w.rsample((4000,))
print("q(W) for layers.1.weight:", tuple(q_w.mean.shape))
print("  max |sample mean - mean| / sd:", float(((samples.mean(0) - q_w.mean) / q_w.stddev).abs().max().detach()))
print("  sample var / var, mean over entries:", float((samples.var(0) / q_w.variance).mean().detach()))
correlation = torch.corrcoef(samples[:, :4, :4].reshape(4000, -1).T)
fig, ax = plt.subplots(figsize=(4, 3.4))
image = ax.imshow(correlation.detach(), cmap="RdBu_r", vmin=-1, vmax=1)
ax.set_title("correlations of W[:4, :4] under q")
fig.colorbar(image)
fig.tight_layout()
fig.savefig(OUT / "whvi_from_scratch_correlations.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ![correlations](figures/whvi_from_scratch_correlations.png)
#
# ## 5. Save and restore
#
# The guide is a `PyroModule`: `state_dict()` / `load_state_dict()` work, as does Pyro's param store.

# %%
state = whvi.state_dict()
restored = AutoWHVIGuide(BNN(), expose="all")
restored(x, y)  # build the parameters (shapes come from a trace of the model)
restored.load_state_dict(state)
torch.testing.assert_close(restored.weight_distribution("layers.1.weight").mean, q_w.mean)
print("restored guide matches")

# %% [markdown]
# Next: [`nf_whvi.py`](nf_whvi.py) (normalizing flows over `g`, local reparameterization) and the UCI
# benchmark, `whvi uci --data-dir ../shared/datasets/uci/yacht --methods mfg,mcd,whvi`.
