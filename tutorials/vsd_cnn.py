# %% [markdown]
# # VSD on a convolutional network
#
# Variational Structured Dropout (Nguyen et al., NeurIPS 2021, §3) is dropout whose noise is learned
# and correlated: every weight `W = diag(xi) Theta` with `xi ~ N(1, U diag(alpha) U^T)` and `U` a
# product of `T` Householder reflections, one noise draw per example (like dropout, multiplying
# activations, never a noisy `W` per example). The KL term is the empirical-Bayes one of eq. (6),
# independent of `Theta`. `AutoVSDGuide` does it for every `Linear` and `Conv` weight of a Pyro model:
# a conv layer's `xi` scales its output channels.
#
# We train a small Bayesian CNN on scikit-learn's digits (bundled, no download) with VSD and with MC
# dropout, at the same budget, and compare test error, NLL and calibration.
#
# `PYRO_WHVI_TUTORIAL_FAST=1` runs a short version (the test suite does); `PYRO_WHVI_TUTORIAL_OUT`
# says where the figures go.

# %%
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, init_to_sample
from pyro.optim import PyroOptim

from pyro_whvi import AutoVSDGuide, KLAnnealing
from pyro_whvi.data import load_digits_split
from pyro_whvi.metrics import categorical_nll, error_rate, expected_calibration_error, reliability_diagram
from pyro_whvi.nn import BayesianCNN

FAST = os.environ.get("PYRO_WHVI_TUTORIAL_FAST") == "1"
OUT = Path(os.environ.get("PYRO_WHVI_TUTORIAL_OUT", Path(__file__).parent / "figures"))
OUT.mkdir(parents=True, exist_ok=True)
STEPS = 20 if FAST else 1500
SAMPLES = 8 if FAST else 100
pyro.set_rng_seed(0)

data = load_digits_split(seed=0, images=True)  # (N, 1, 8, 8) pixels in [0, 1]
num_data = len(data.y_train)
print(f"{num_data} training and {len(data.y_test)} test images")

# %% [markdown]
# ## 1. The guide
#
# `BayesianCNN` is an ordinary `PyroModule` (two 3x3 conv layers, one hidden FC layer) with
# `N(0, 1/fan_in)` priors on every weight. `AutoVSDGuide(model, reflections=2)` gives its four weight
# sites VSD noise with `T = 2` Householder reflections; biases get a mean-field Normal. As with WHVI,
# the guide transforms the model in place, and the same `model` goes to `SVI` and `Predictive`.
#
# The VSD paper tempers the KL on classification (App. I.1–I.2: a factor of 0.1–0.5):
# `KLAnnealing` wraps the model and the guide, and works with any guide.

# %%


def train(model, guide, kl_weight=1.0):
    annealing = KLAnnealing(kl_weight)
    svi = SVI(annealing(model), annealing(guide), PyroOptim(torch.optim.Adam, {"lr": 2e-3}), Trace_ELBO())
    generator = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        index = torch.randint(num_data, (100,), generator=generator)
        svi.step(data.x_train[index], data.y_train[index], num_data=num_data)


def evaluate(model, guide):
    with torch.no_grad():
        predictive = Predictive(model, guide=guide, num_samples=SAMPLES, return_sites=["f"])
        logits = predictive(data.x_test)["f"].reshape(SAMPLES, len(data.y_test), 10)
    return {
        "error": float(error_rate(logits, data.y_test)),
        "NLL": float(categorical_nll(logits, data.y_test)),
        "ECE": float(expected_calibration_error(logits, data.y_test)),
        "reliability": reliability_diagram(logits, data.y_test),
    }


pyro.clear_param_store()
vsd_model = BayesianCNN()
vsd = AutoVSDGuide(vsd_model, reflections=2)
train(vsd_model, vsd, kl_weight=0.1)
results = {"VSD (T = 2)": evaluate(vsd_model, vsd)}

# %% [markdown]
# MC dropout: the same network with dropout on the FC layers' inputs and a point estimate under the
# prior (Pyro's `AutoDelta`; the prior is the weight decay), predicting with dropout on.

# %%
pyro.clear_param_store()
dropout_model = BayesianCNN(dropout=0.2)
mc_dropout = AutoDelta(dropout_model, init_loc_fn=init_to_sample)
train(dropout_model, mc_dropout, kl_weight=0.1)
results["MC dropout (0.2)"] = evaluate(dropout_model, mc_dropout)

for name, r in results.items():
    print(f"{name:18s} error {r['error']:.4f}  NLL {r['NLL']:.4f}  ECE {r['ECE']:.4f}")

# %% [markdown]
# ## 2. Calibration
#
# A reliability diagram bins test points by the predictive's confidence: a calibrated model's bars
# sit on the diagonal. ECE is their size-weighted distance to it.

# %%
fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
for ax, (name, r) in zip(axes, results.items()):
    confidence, accuracy, count = r["reliability"]
    keep = count > 0
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    ax.bar(confidence[keep], accuracy[keep], width=1 / len(count), alpha=0.6, edgecolor="C0")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title=f"{name}: ECE {r['ECE']:.3f}")
fig.tight_layout()
fig.savefig(OUT / "vsd_cnn_reliability.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ![reliability](figures/vsd_cnn_reliability.png)
#
# ## 3. What VSD learned
#
# `guide.noise_distribution(site)` is `q(xi)` of one weight site (a `StructuredDropoutNoise`): its
# covariance `U diag(alpha) U^T` is dense, so the noise on different channels can be correlated —
# what plain (Gaussian) dropout cannot express — and each channel gets its own noise level. Here, the
# first conv layer's 16 channels: on this small problem the learned levels differ by channel, the
# correlations stay weak (the largest is printed).

# %%
noise = vsd.noise_distribution("conv1.weight")
covariance = noise.covariance_matrix.detach()
scale = covariance.diagonal().sqrt()
fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
axes[0].bar(range(len(scale)), scale)
axes[0].set(xlabel="output channel", ylabel="sd of xi", title="learned dropout noise, conv1")
correlation = covariance / scale[:, None] / scale[None, :]
print(
    f"noise sd per channel {scale.min():.3f}-{scale.max():.3f}; largest |correlation| "
    f"{(correlation - torch.eye(len(scale))).abs().max():.2f}"
)
image = axes[1].imshow(correlation, cmap="RdBu_r", vmin=-1, vmax=1)
axes[1].set_title("correlation of xi across channels")
fig.colorbar(image)
fig.tight_layout()
fig.savefig(OUT / "vsd_cnn_noise.png", dpi=110)
plt.close(fig)

# %% [markdown]
# ![noise](figures/vsd_cnn_noise.png)
#
# A fuller comparison (MLP and CNN, five seeds, hyperparameters chosen on validation data for every
# method) is `python benchmarks/vsd_digits.py --models mlp`, then `--models cnn`; its results are in
# `benchmarks/results/vsd_digits_*.md`. For the per-epoch cost of VSD against the deterministic
# network, `whvi bench vsd`.
