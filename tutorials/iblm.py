# %% [markdown]
# # I-BLM: start variational inference from Bayesian linear regressions
#
# SVI on a deep Bayesian network spends its first thousands of steps getting out of its
# initialization. I-BLM (Rossi, Michiardi and Filippone, ICML 2019) starts it somewhere useful: layer by
# layer, each unit is a Bayesian linear regression from the layer's inputs (propagated through the
# layers already initialized) to the targets, and `q` is set to the best approximation of its
# posterior. `pyro_whvi.iblm_` does this in place for Pyro's `AutoNormal` and for our `AutoWHVIGuide`
# and `AutoVSDGuide`, then you train with Pyro's own `SVI`.
#
# Run it as a script (`python tutorials/iblm.py`); `PYRO_WHVI_TUTORIAL_FAST=1` runs a short version
# (what the test suite does) and `PYRO_WHVI_TUTORIAL_OUT` says where the figures go (default: next to
# this file, in `figures/`).

# %%
import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.optim import PyroOptim

from pyro_whvi import AutoWHVIGuide, iblm_
from pyro_whvi.data import load_digits_split, toy_regression_1d
from pyro_whvi.metrics import categorical_nll, error_rate
from pyro_whvi.nn import BayesianCNN, BayesianMLP

FAST = os.environ.get("PYRO_WHVI_TUTORIAL_FAST") == "1"
OUT = Path(os.environ.get("PYRO_WHVI_TUTORIAL_OUT", Path(__file__).parent / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
STEPS = 30 if FAST else 1000
SAMPLES = 10 if FAST else 100  # posterior draws per predictive band; the evaluations below take half
EVALUATIONS = 3 if FAST else 20  # points of each test-MNLL curve (besides step 0)
pyro.set_rng_seed(0)

# %% [markdown]
# ## 1. A deep regression network, before any training
#
# The WHVI paper's 1-D problem (a gap in the inputs) and a 3 x 64 ReLU network with `N(0, 1/fan_in)`
# priors. We build the same guide twice: as constructed, and after `iblm_`.

# %%
x, y = toy_regression_1d(128)
grid = torch.linspace(-1.5, 2.5, 200).unsqueeze(-1)


def make_guide(init: str):
    pyro.clear_param_store()
    model = BayesianMLP([1, 64, 64, 64, 1], noise_scale=0.1)
    guide = AutoWHVIGuide(model, mean_field_last_layer=True)
    guide(x, y)  # set the guide up (its default initialization)
    if init == "iblm":
        iblm_(guide, (x, y))  # in place; (x, y) tensors or a DataLoader
    return model, guide


def band(model, guide):
    predictive = Predictive(model, guide=guide, num_samples=SAMPLES, return_sites=["f"], parallel=False)
    f = predictive(grid)["f"].reshape(SAMPLES, -1)
    return f.mean(0), f.std(0)


fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
for ax, init in zip(axes, ("default", "iblm")):
    model, guide = make_guide(init)
    mean, std = band(model, guide)
    ax.fill_between(grid[:, 0], mean - 2 * std, mean + 2 * std, alpha=0.3, label="±2 sd")
    ax.plot(grid[:, 0], mean, label="predictive mean")
    ax.scatter(x[:, 0], y, s=6, color="k", label="data")
    ax.set_title(f"step 0, {init} init")
axes[0].legend(loc="lower left")
fig.tight_layout()
fig.savefig(OUT / "iblm_toy_step0.png", dpi=110)
plt.close(fig)

# %% [markdown]
# From its default initialization the network is a prior draw; after `iblm_` it already follows the
# data. How? For the output layer, unit `j` regresses on target column `j`: a homoscedastic Bayesian
# linear model whose noise variance the marginal likelihood picks (I-BLM App. B–C). Hidden units
# regress on a standardized target column with a random sign, so that half carry `relu(f)` and half
# `relu(-f)` (with the paper's raw targets every unit would fit the same function and the ReLU would
# drop half of it). See `help(pyro_whvi.iblm_)` and `pyro_whvi/init/iblm.py` for every choice.
#
# ## 2. Training from either start
#
# The same SVI (Pyro's own) from both initializations; the test MNLL of the noisy targets is tracked.

# %%
x_test, y_test = toy_regression_1d(256, seed=1)


def train(init: str, steps: int) -> list[float]:
    model, guide = make_guide(init)
    svi = SVI(model, guide, PyroOptim(torch.optim.Adam, {"lr": 1e-2}), Trace_ELBO())
    curve, draws = [], SAMPLES // 2
    for step in range(steps + 1):
        if step % max(steps // EVALUATIONS, 1) == 0:
            predictive = Predictive(model, guide=guide, num_samples=draws, return_sites=["f"], parallel=False)
            f = predictive(x_test)["f"].reshape(draws, -1)
            noise = float(model.noise_scale.detach())
            log_lik = torch.distributions.Normal(f, noise).log_prob(y_test).logsumexp(0) - math.log(draws)
            curve.append(-float(log_lik.mean()))
        if step < steps:
            svi.step(x, y)
    return curve


curves = {init: train(init, STEPS) for init in ("default", "iblm")}
fig, ax = plt.subplots(figsize=(5, 3.2))
for init, curve in curves.items():
    ax.plot(torch.linspace(0, STEPS, len(curve)), curve, label=init)
ax.set_yscale("symlog", linthresh=1.0)
ax.set_xlabel("SVI step")
ax.set_ylabel("test MNLL")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "iblm_toy_training.png", dpi=110)
plt.close(fig)
print({init: round(curve[-1], 3) for init, curve in curves.items()})

# %% [markdown]
# I-BLM starts far ahead, but on this problem it does **not** stay ahead: after 1,000 steps the
# default initialization reaches a lower test MNLL (0.60 against 0.90 in the full run; the figure
# `figures/iblm_toy_training.png`). With a single input, every first-layer unit regresses `±y` on `x`,
# so all of them put their ReLU kink near the same point, and SVI has to pull them apart before the
# network can follow the wiggles, while a prior draw scatters the kinks from the start. I-BLM pays off
# when a linear read-out of each layer's inputs already says something about the targets: Concrete's 8
# inputs and the digits' pixels in the benchmark below, where it leads at step 0 and after 1,000 steps.
#
# ## 3. Classification and convolutions
#
# For a categorical likelihood the labels go through the Dirichlet transform (I-BLM §4.3) and the
# output layer solves a heteroscedastic Bayesian linear model (App. C); convolutions regress from
# unfolded patches (§4.4). Pyro's `AutoNormal` on a small CNN for scikit-learn's digits, from its own
# initialization (zero means) and from I-BLM:

# %%
digits = load_digits_split(seed=0, images=True)
for init in ("default", "iblm"):
    pyro.clear_param_store()
    model = BayesianCNN()
    guide = AutoNormal(model)
    guide(digits.x_train[:64], digits.y_train[:64])
    if init == "iblm":
        iblm_(guide, (digits.x_train, digits.y_train), batch_size=256)  # fc1 has 129 coefficients
    predictive = Predictive(model, guide=guide, num_samples=20, return_sites=["f"])
    logits = predictive(digits.x_test)["f"].reshape(20, *digits.x_test.shape[:1], 10)
    print(
        f"{init:8s} step 0: test error {float(error_rate(logits, digits.y_test)):.3f}, "
        f"NLL {float(categorical_nll(logits, digits.y_test)):.3f}"
    )

# %% [markdown]
# `benchmarks/iblm_init.py` runs the full comparison (Concrete with a 5 x 100 network and this CNN,
# `AutoNormal` and `AutoWHVIGuide`, default vs Xavier vs I-BLM, 1,000 SVI steps, 3 seeds); its table is
# in the docs, `docs/results/iblm.md`.
