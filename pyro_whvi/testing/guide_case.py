"""The checks every guide configuration passes, as a reusable base class (GPyTorch's ``BaseKernelTestCase``
idea): a subclass says how to build its guide, and inherits one test per check.

Shipped for users who write their own guide, as ``gpytorch.test`` ships its bases (it needs ``pytest``, in
the ``dev`` extra): subclass it in a ``test_*.py`` file, name the subclass ``Test...``, implement
:meth:`StructuredGuideTestCase.make_guide` and set ``structured_groups``::

    from pyro_whvi.testing import StructuredGuideTestCase

    class TestMyGuide(StructuredGuideTestCase):
        structured_groups = frozenset({"locs", "scales"})

        def make_guide(self, model):
            return MyGuide(model)

``StructuredGuideTestCase`` itself is not collected by pytest (its name does not start with ``Test``);
``tests/infer/test_guide_conformance.py`` holds the library's own subclasses. Each test runs in float64 with
Pyro's validation on, seed 0 and an empty param store (the class's autouse fixture).
The checks:

* each of Pyro's ``Trace_ELBO``, ``TraceMeanField_ELBO``, ``TraceGraph_ELBO`` trains through ``SVI`` with
  finite losses and without Pyro's model/guide mismatch warnings (or, for an ELBO the subclass declares
  in ``unsupported_elbos``, raises the error it names); ``Trace_ELBO``/``TraceGraph_ELBO`` agree on the
  same draws, and ``TraceMeanField_ELBO`` (analytic KLs) agrees with ``Trace_ELBO`` in expectation;
* ``Predictive`` returns every latent, structured, deterministic and observed site with ``num_samples``
  leading and the site's own shape trailing, and the latent draws vary;
* a minibatch likelihood is scaled to the full data: exactly, for ``BayesianMLP``'s ``num_data=`` on a
  partition of the data (same draws), and in expectation for a data plate with ``subsample_size``; a
  per-example latent in that plate is subsampled by the guide as by the model;
* ``guide.state_dict()`` (with the model's) and the param store's ``get_state``/``set_state`` rebuild a guide
  whose seeded predictions equal the original's;
* ``.to(torch.float64)`` on a float32 model and guide gives float64 parameters, samples and training
  (``.to("cuda")`` likewise, with the ``cuda`` marker);
* after some SVI steps every parameter of every *structured* site has moved, each site holding the
  parameter groups the subclass lists in ``structured_groups``, and so has every other guide parameter.
"""

from __future__ import annotations

import io
import math
import warnings

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import PyroOptim
from torch import Tensor

from ..infer import local_reparameterization
from .conformance_models import ELBOS, MISMATCH_WARNINGS, LocalLatentMLP, data_plate, parameter_groups
from .guide_case_base import GuideCaseBase

__all__ = ["StructuredGuideTestCase"]


class StructuredGuideTestCase(GuideCaseBase):
    """Base of the guide conformance tests: one test per check of the module docstring. A subclass
    (named ``Test...``) implements :meth:`~GuideCaseBase.make_guide` and sets ``structured_groups``; the
    other hooks are :class:`~pyro_whvi.testing.guide_case_base.GuideCaseBase`'s."""

    # -- ELBOs -----------------------------------------------------------------------------------

    @pytest.mark.parametrize("elbo", list(ELBOS))
    def test_svi_trains_with_each_elbo(self, elbo):
        model, guide, x, y = self._setup()
        svi = self._svi(model, guide, ELBOS[elbo]())
        if elbo in self.unsupported_elbos:
            error, match = self.unsupported_elbos[elbo]
            with pytest.raises(error, match=match):
                svi.step(x, y)
            return
        with warnings.catch_warnings():
            for message in MISMATCH_WARNINGS:
                warnings.filterwarnings("error", message=message)
            losses = [svi.step(x, y) for _ in range(3)]
        assert all(math.isfinite(loss) for loss in losses), losses

    def test_trace_and_tracegraph_elbo_agree_on_the_same_draws(self):
        """Every site is reparameterized, so TraceGraph_ELBO's surrogate adds nothing to the loss."""
        model, guide, x, y = self._setup()
        supported = [name for name in ("Trace_ELBO", "TraceGraph_ELBO") if name not in self.unsupported_elbos]
        losses = []
        for name in supported:
            pyro.set_rng_seed(3)
            losses.append(ELBOS[name]().loss(model, guide, x, y))
        assert all(loss == pytest.approx(losses[0], rel=1e-12) for loss in losses)

    def test_tracemeanfield_elbo_matches_trace_elbo_in_expectation(self):
        """TraceMeanField_ELBO uses Pyro's analytic KL where one is registered for a site's (guide, prior)
        pair and Trace_ELBO's Monte-Carlo term elsewhere, so the two losses have the same mean. From the
        same seed they share every draw, and differ by the Monte-Carlo KL's error at the analytic sites: the
        mean of 30 paired differences must be within 5 standard errors of zero (t with 29 degrees of
        freedom: a false failure about once in 40,000; fixed seeds, so deterministic), or all of them
        rounding-level where no site has an analytic KL."""
        if {"Trace_ELBO", "TraceMeanField_ELBO"} & set(self.unsupported_elbos):
            pytest.skip("the guide does not support both ELBOs")
        model, guide, x, y = self._setup()
        particles, differences, scale = 30, [], 0.0
        with torch.no_grad():
            for seed in range(particles):
                pyro.set_rng_seed(seed)
                trace = Trace_ELBO().loss(model, guide, x, y)
                pyro.set_rng_seed(seed)
                differences.append(trace - TraceMeanField_ELBO().loss(model, guide, x, y))
                scale = max(scale, abs(trace))
        values = torch.tensor(differences)
        if values.abs().max() > 1e-9 * scale:
            t_statistic = values.mean() / (values.std() / particles**0.5)
            assert t_statistic.abs() < 5, (float(values.mean()), float(values.std()))

    # -- Predictive ------------------------------------------------------------------------------

    def test_predictive_returns_every_site_with_num_samples_leading(self):
        model, guide, x, y = self._setup()
        self._svi(model, guide).step(x, y)
        shapes = self._return_sites(model, guide, x, y)
        samples = self._predict(model, guide, x, shapes)
        assert set(samples) == set(shapes)
        for name, shape in shapes.items():
            value = samples[name]
            # Predictive(parallel=False) keeps a size-1 dim per plate of the model between the two.
            assert value.shape[0] == self.num_samples and value.shape[value.dim() - len(shape) :] == shape, name
            assert math.prod(value.shape[1 : value.dim() - len(shape)]) == 1, (name, value.shape)
            assert type(value) is Tensor and torch.isfinite(value).all(), name
            # Every latent site varies across draws, and so do the network's output and the observations.
            assert (value != value[:1]).any(), f"{name}: the {self.num_samples} draws are identical"

    # -- subsampling -----------------------------------------------------------------------------

    def test_minibatch_likelihood_is_scaled_to_the_full_data(self):
        """``num_data=N`` on the minibatches of a partition: with the same draws of every latent (same seed,
        one draw per site: local reparameterization off) the minibatch losses average to the full-data
        loss exactly, since each minibatch's log-likelihood is scaled by ``N / B`` and nothing else is.
        Unscaled, the average would miss ``(1 - B / N)`` of the likelihood term, far outside rounding."""
        model, guide, x, y = self._setup()
        self._svi(model, guide).step(x, y)
        elbo = Trace_ELBO()

        def loss(*args, **kwargs):
            pyro.set_rng_seed(11)
            with local_reparameterization(False):
                return elbo.loss(model, guide, *args, **kwargs)

        full = loss(x, y)
        batches = torch.arange(self.num_data).split(self.batch_size)
        scaled = sum(loss(x[index], y[index], num_data=self.num_data) for index in batches) / len(batches)
        unscaled = sum(loss(x[index], y[index]) for index in batches) / len(batches)
        assert scaled == pytest.approx(full, rel=1e-9, abs=1e-9)
        assert unscaled != pytest.approx(full, rel=1e-3)

    def test_subsampled_data_plate_trains_and_matches_the_full_elbo_in_expectation(self):
        """``pyro.plate("data", N, subsample_size=B)``: SVI trains on it, and its loss is unbiased for the
        full-data loss with local reparameterization on (fresh per-example draws). Each particle computes
        the full and the subsampled loss from the same seed, hence the same draws of every latent and of
        every example's noise (all drawn before the minibatch), so their difference is the minibatch's
        sampling error alone. Its mean over the particles must be within 5 standard errors of zero (a
        false failure with probability about 2e-5, t with 29 degrees of freedom; the seeds are fixed, so
        the test is deterministic), and the same difference with the likelihood left unscaled must be over
        5 standard errors away (so that a missing ``N / B`` fails the first check)."""
        model, guide, x, y = self._setup()
        svi = self._svi(model, guide)
        losses = [svi.step(x, y, subsample_size=self.batch_size) for _ in range(5)]
        assert all(math.isfinite(loss) for loss in losses), losses
        particles, elbo = 30, Trace_ELBO()

        def loss(seed: int, **kwargs) -> float:
            pyro.set_rng_seed(seed)
            return elbo.loss(model, guide, x, y, **kwargs)

        differences, unscaled = [], []
        with torch.no_grad():
            for seed in range(particles):
                full = loss(seed)
                differences.append(full - loss(seed, subsample_size=self.batch_size))
                unscaled.append(full - loss(seed, subsample_size=self.batch_size, scale_likelihood=False))
        for values, unbiased in ((torch.tensor(differences), True), (torch.tensor(unscaled), False)):
            t_statistic = values.mean() / (values.std() / particles**0.5)
            assert (t_statistic.abs() < 5) == unbiased, (unbiased, float(t_statistic))

    def test_local_latents_in_a_subsampled_plate_follow_the_minibatch(self):
        """A per-example latent inside ``pyro.plate("data", N, subsample_size=B)``, with the guide given the
        plate through ``create_plates`` (as Pyro's autoguides take it): the guide keeps one parameter per
        example of all N, and an SVI step on a minibatch (SGD: no momentum to move the others) changes exactly
        the B entries of the model's minibatch (the guide's subsample, replayed in the model), of the
        location and of the scale."""
        model = LocalLatentMLP(list(self.widths))
        guide = self.make_guide(model)
        guide.create_plates = data_plate
        x, y = self.make_data()
        guide(x, y, subsample_size=self.batch_size)
        locs = {name: value for name, value in guide.named_parameters() if parameter_groups(name)[1] == "offset"}
        assert sorted(parameter_groups(name)[0] for name in locs) == ["locs", "scales"], sorted(locs)
        assert all(value.shape == (self.num_data,) for value in locs.values()), {k: v.shape for k, v in locs.items()}
        svi = self._svi(model, guide, optim=PyroOptim(torch.optim.SGD, {"lr": self.lr}))  # no momentum
        for _ in range(2):
            before = {name: value.detach().clone() for name, value in locs.items()}
            assert math.isfinite(svi.step(x, y, subsample_size=self.batch_size))
            assert model.last_index is not None and len(model.last_index) == self.batch_size
            for name, value in locs.items():
                changed = (value.detach() != before[name]).nonzero().flatten()
                assert changed.tolist() == sorted(model.last_index.tolist()), name

    # -- state ----------------------------------------------------------------------------------

    def _trained_predictions(self):
        """A model and guide after ``steps`` SVI steps, their data, and their seeded predictions of every site."""
        model, guide, x, y = self._setup()
        svi = self._svi(model, guide)
        for _ in range(self.steps):
            svi.step(x, y)
        sites = self._return_sites(model, guide, x, y)
        return model, guide, x, y, sites, self._predict(model, guide, x, sites)

    def _assert_same_predictions(self, model, guide, x, sites, expected) -> None:
        got = self._predict(model, guide, x, sites)
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)

    def test_state_dict_round_trip_gives_identical_predictions(self):
        model, guide, x, y, sites, expected = self._trained_predictions()
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "guide": guide.state_dict()}, buffer)

        pyro.clear_param_store()
        fresh_model = self.make_model()
        fresh = self.make_guide(fresh_model)
        fresh(x, y)  # creates its parameters, overwritten below
        buffer.seek(0)
        state = torch.load(buffer)
        fresh_model.load_state_dict(state["model"])
        fresh.load_state_dict(state["guide"])
        self._assert_same_predictions(fresh_model, fresh, x, sites, expected)

    def test_param_store_state_round_trip_gives_identical_predictions(self):
        _, _, x, y, sites, expected = self._trained_predictions()
        buffer = io.BytesIO()
        torch.save(pyro.get_param_store().get_state(), buffer)

        pyro.clear_param_store()
        buffer.seek(0)
        pyro.get_param_store().set_state(torch.load(buffer, weights_only=False))
        fresh_model = self.make_model()
        fresh = self.make_guide(fresh_model)
        fresh(x, y)  # its parameters are read from the store
        self._assert_same_predictions(fresh_model, fresh, x, sites, expected)

    # -- placement ------------------------------------------------------------------------------

    def _check_moved(self, dtype: torch.dtype, device: str) -> None:
        torch.set_default_dtype(torch.float32)  # the conftest fixture restores the default afterwards
        model, guide, x, y = self._setup()
        assert {p.dtype for p in guide.parameters()} == {torch.float32}
        model.to(device=device, dtype=dtype)
        guide.to(device=device, dtype=dtype)
        x, y = x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)
        for name, parameter in guide.named_parameters():
            assert parameter.dtype == dtype and parameter.device.type == device, name
        svi = self._svi(model, guide)  # a new optimizer: Adam's state follows no .to()
        losses = [svi.step(x, y) for _ in range(2)]
        assert all(math.isfinite(loss) for loss in losses), losses
        sites = self._return_sites(model, guide, x, y)
        samples = self._predict(model, guide, x, sites)
        for name, value in samples.items():
            assert value.dtype == dtype and value.device.type == device, (name, value.dtype, value.device)
        for name, value in pyro.get_param_store().named_parameters():
            assert value.dtype == dtype and value.device.type == device, name

    def test_to_float64(self):
        self._check_moved(torch.float64, "cpu")

    @pytest.mark.cuda
    def test_to_cuda(self):
        self._check_moved(torch.float32, "cuda")

    # -- learning -------------------------------------------------------------------------------

    def test_every_structured_site_parameter_moves_under_svi(self):
        """Each structured site has parameters in every group of ``structured_groups``, and after SVI each of
        them (and every mean-field parameter) differs from its initial value, in the guide and in the
        param store SVI optimized (save those :meth:`may_stay` exempts before and after training)."""
        model, guide, x, y = self._setup()
        per_site = self.site_parameters(guide)
        assert (len(per_site) > 0) == bool(self.structured_groups), list(per_site)
        for site, parameters in per_site.items():
            groups = {parameter_groups(name)[0] for name in parameters}
            assert groups == self.structured_groups, (site, sorted(groups))
        before = {name: value.detach().clone() for name, value in guide.named_parameters()}
        exempt = {name for name in before if self.may_stay(guide, name)}
        svi = self._svi(model, guide)
        for _ in range(self.steps):
            svi.step(x, y)
        after = dict(guide.named_parameters())
        exempt &= {name for name in after if self.may_stay(guide, name)}
        unmoved = {name for name, value in after.items() if torch.equal(value.detach(), before[name])} - exempt
        frozen = {site: sorted(unmoved & set(parameters)) for site, parameters in per_site.items()}
        assert not any(frozen.values()), f"structured parameters that did not move: {frozen}"
        assert not unmoved, f"guide parameters that did not move: {sorted(unmoved)}"
        store = pyro.get_param_store()
        for name, value in after.items():
            key = f"{guide._pyro_name}.{name.removesuffix('_unconstrained')}"
            assert store[key].unconstrained() is value, f"{key}: the guide's parameter is not the one SVI optimized"
