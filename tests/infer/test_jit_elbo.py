"""Pyro's JIT-compiled ELBOs with every guide of the library: ``SVI`` + ``JitTrace_ELBO`` computes what
``Trace_ELBO`` computes (loss and gradients), through ``SVI`` and through ``ELBOModule``; ``JitTraceMeanField_ELBO``
compiles once; the per-example draws stay per example; what cannot be compiled raises, naming the fix.

Each check runs on both ways of compiling: ``torch.jit.trace`` (``backend="torchscript"``, Pyro's) and the aten-level
recording handed to ``torch.compile``, here with its ``"eager"`` backend: the recording, which is ours, run as it
is (about a second per graph, where AOTAutograd and Inductor take seconds more to compile what it recorded).
``test_inductor_takes_the_eager_steps`` compiles one recording with Inductor, forward and backward.

Exact comparisons run the compiled graph as traced (``torch.jit.optimized_execution(False)``): PyTorch's optimizing
executor may reorder independent random draws (it does for the full and low-rank ``q(g)``, whose
``MultivariateNormal`` draws it regroups), which changes which numbers each site gets but not their distribution.
"""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.ops.jit import trace as jit_trace
from pyro.optim import PyroOptim

from pyro_whvi import iblm_
from pyro_whvi.infer import JitTrace_ELBO, JitTraceMeanField_ELBO, JointOptim, KLAnnealing, example_seeds
from pyro_whvi.infer.tracing import record_for_compile
from pyro_whvi.testing.conformance_models import ConformanceMLP

from ..helpers import GUIDES

WIDTHS = [4, 8, 8, 1]
EXACT = ["whvi", "whvi-full", "whvi-lowrank", "nf-whvi", "whvi-paper", "whvi-iblm", "mfg"]
VSD = ["vsd", "vsd-h"]
BACKENDS = ["torchscript", "eager"]


@pytest.fixture(autouse=True)
def _environment():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            yield
    finally:
        torch.set_default_dtype(previous)
        pyro.clear_param_store()


def _data(num: int = 16):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(num, WIDTHS[0], generator=generator)
    return x, torch.sin(x.sum(-1)) + 0.1 * torch.randn(num, generator=generator)


def _setup(kind: str):
    """A set-up guide (``whvi-iblm``: AutoWHVIGuide initialized by I-BLM) on a fresh model."""
    model = ConformanceMLP(WIDTHS)
    guide = GUIDES["whvi" if kind == "whvi-iblm" else kind](model)
    x, y = _data()
    if kind == "whvi-iblm":
        iblm_(guide, (x, y), batch_size=len(x))
    guide(x, y)
    return model, guide, x, y


def _parameters():
    store = pyro.get_param_store()
    return {name: store[name].unconstrained() for name in sorted(store.keys())}


def _svi_loss_and_grads(elbo, model, guide, x, y, seed: int | None):
    """``elbo.loss_and_grads`` (what ``SVI.step`` calls) from ``seed``: the loss and every parameter's gradient."""
    parameters = _parameters()
    for p in parameters.values():
        p.grad = None
    if seed is not None:
        pyro.set_rng_seed(seed)
    loss = elbo.loss_and_grads(model, guide, x, y)
    return loss, {name: p.grad.clone() for name, p in parameters.items() if p.grad is not None}


def _module_loss_and_grads(module, x, y, seed: int):
    """``ELBOModule`` (``elbo(model, guide)``) from ``seed``: the loss and the gradients of its parameters."""
    pyro.set_rng_seed(seed)
    loss = module(x, y)
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return loss.detach(), {name: g for (name, _), g in zip(named, grads) if g is not None}


def _assert_same(first, second, scale: float = 1.0):
    torch.testing.assert_close(torch.as_tensor(first[0]), torch.as_tensor(second[0]))
    assert sorted(first[1]) == sorted(second[1]) and first[1]
    for name in first[1]:
        torch.testing.assert_close(first[1][name], scale * second[1][name], msg=name)


def _graphs(elbo) -> int:
    """How many graphs a compiled ELBO holds."""
    compiled = elbo._differentiable_loss if isinstance(elbo, JitTraceMeanField_ELBO) else elbo._loss_and_surrogate_loss
    return len(compiled.compiled)


@pytest.mark.parametrize("kind", EXACT)
@pytest.mark.parametrize(
    "make_elbo",
    [pyro.infer.JitTrace_ELBO, JitTrace_ELBO, lambda: JitTrace_ELBO(backend="eager")],
    ids=["pyro", "ours", "ours-eager"],
)
def test_svi_jit_loss_and_gradients_equal_trace_elbo(kind, make_elbo):
    model, guide, x, y = _setup(kind)
    jit, eager = make_elbo(), Trace_ELBO()
    with torch.jit.optimized_execution(False):
        _svi_loss_and_grads(jit, model, guide, x, y, seed=0)  # compiles
        for seed in (3, 4):
            _assert_same(
                _svi_loss_and_grads(jit, model, guide, x, y, seed), _svi_loss_and_grads(eager, model, guide, x, y, seed)
            )
        # Another batch size: through the same graph with TorchScript (its shapes follow the input), through a
        # graph of its own with torch.compile (the recording bakes the shapes).
        half = x[:8], y[:8]
        _assert_same(
            _svi_loss_and_grads(jit, model, guide, *half, 5), _svi_loss_and_grads(eager, model, guide, *half, 5)
        )
    if isinstance(jit, JitTrace_ELBO):
        assert _graphs(jit) == (1 if jit.backend == "torchscript" else 2)


@pytest.mark.slow
def test_inductor_takes_the_eager_steps():
    """``backend="inductor"`` (fused kernels, eager's random generator): NF-WHVI's loss and gradients are
    Trace_ELBO's seed for seed, through SVI and through ELBOModule, from one compiled graph."""
    model, guide, x, y = _setup("nf-whvi")
    jit, eager = JitTrace_ELBO(backend="inductor"), Trace_ELBO()
    _svi_loss_and_grads(jit, model, guide, x, y, seed=0)  # compiles
    for seed in (3, 4):
        _assert_same(
            _svi_loss_and_grads(jit, model, guide, x, y, seed), _svi_loss_and_grads(eager, model, guide, x, y, seed)
        )
    module = jit(model, guide)
    _assert_same(_module_loss_and_grads(module, x, y, 5), _module_loss_and_grads(eager(model, guide), x, y, 5))
    assert _graphs(jit) == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["whvi", "whvi-lowrank", "vsd-h", "mfg"])
def test_elbo_module_gradients_are_the_elbos_and_pyros_are_twice_them(kind, backend):
    """``elbo(model, guide)``: ours gives Trace_ELBO's loss and gradients; Pyro's own
    ``JitTrace_ELBO.differentiable_loss`` doubles every gradient (Pyro 1.9), which is why ours exists.

    VSD under ``torch.jit.trace``: ours and Pyro's at the same draws, not Trace_ELBO's (the trace drops the site's
    draw of ``xi``, which local reparameterization never uses: see ``test_jit_elbo_equals_eager_in_distribution``);
    torch.compile's ``"eager"`` backend runs the recording with that draw in it, seed for seed Trace_ELBO's."""
    model, guide, x, y = _setup(kind)
    modules = {"ours": JitTrace_ELBO(backend=backend)(model, guide), "pyro": pyro.infer.JitTrace_ELBO()(model, guide)}
    eager = Trace_ELBO()(model, guide)
    with torch.jit.optimized_execution(False):
        for module in modules.values():
            module(x, y)  # compiles
        pyros = _module_loss_and_grads(modules["pyro"], x, y, 3)
        ours = _module_loss_and_grads(modules["ours"], x, y, 3)
        if kind.startswith("vsd") and backend == "torchscript":
            _assert_same(pyros, ours, scale=2.0)
            return
        reference = _module_loss_and_grads(eager, x, y, 3)
        _assert_same(ours, reference)
        if not kind.startswith("vsd"):
            _assert_same(pyros, reference, scale=2.0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["whvi", "whvi-full", "nf-whvi", "vsd-h", "mfg"])
def test_jit_mean_field_compiles_once(kind, backend):
    """Ours compiles on the first call only (AutoNormal's draws all reach the loss, so it then matches
    TraceMeanField_ELBO seed for seed; the structured guides' in distribution, see the next test). Pyro's class
    compiles on every call: its compiled function is stored under another name than the one it checks."""
    model, guide, x, y = _setup(kind)
    ours, pyros = JitTraceMeanField_ELBO(backend=backend), pyro.infer.JitTraceMeanField_ELBO()
    with torch.jit.optimized_execution(False):
        ours.loss_and_grads(model, guide, x, y)
        compiled = ours._differentiable_loss
        for seed in (3, 4):
            loss_and_grads = _svi_loss_and_grads(ours, model, guide, x, y, seed)
            if kind == "mfg":
                _assert_same(loss_and_grads, _svi_loss_and_grads(TraceMeanField_ELBO(), model, guide, x, y, seed))
        assert ours._differentiable_loss is compiled and len(compiled.compiled) == 1
        if backend == "torchscript":
            pyros.loss_and_grads(model, guide, x, y)
            first = pyros._differentiable_loss
            pyros.loss_and_grads(model, guide, x, y)
            assert pyros._differentiable_loss is not first


@pytest.mark.parametrize(
    ("kind", "elbos"),
    [("vsd-h", "trace"), ("whvi-lowrank", "mean-field")],
)
def test_jit_elbo_equals_eager_in_distribution(kind, elbos):
    """In distribution, not seed for seed, where a guide draws a value that the loss does not use: the JIT drops
    that draw from the compiled graph, so every later draw takes other numbers of the stream. A VSD weight draws
    its site's own ``xi`` as the guide samples it (for ops that need the dense weight), which local
    reparameterization never uses; under TraceMeanField_ELBO a WHVI site's own ``g`` only feeds the KL, which is
    analytic there. The compiled and the eager loss and gradients have the same mean (within 5 standard errors
    of their difference, 40 steps each), and the seeds do give other numbers."""
    model, guide, x, y = _setup(kind)
    pair = (JitTrace_ELBO(), Trace_ELBO()) if elbos == "trace" else (JitTraceMeanField_ELBO(), TraceMeanField_ELBO())
    pair[0].loss_and_grads(model, guide, x, y)  # compiles
    samples = []
    for elbo in pair:
        pyro.set_rng_seed(11)
        rows = []
        for _ in range(40):
            loss, grads = _svi_loss_and_grads(elbo, model, guide, x, y, seed=None)
            rows.append(torch.cat([torch.tensor([loss]), *(g.reshape(-1) for g in grads.values())]))
        samples.append(torch.stack(rows))
    a, b = samples
    z = (a.mean(0) - b.mean(0)) / ((a.var(0) + b.var(0)) / len(a)).clamp_min(1e-24).sqrt()
    assert z.abs().max() < 5, z.abs().max()
    assert (a[:, 0] != b[:, 0]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["whvi", "nf-whvi", "vsd"])
def test_per_example_draws_stay_per_example_under_the_jit(kind, backend):
    """A compiled model execution (the guide's draws replayed) gives each row of a batch its own weight draw:
    identical rows get different outputs, every call draws anew, and another batch size gets its own draws."""
    model, guide, x, _ = _setup(kind)

    def outputs(inputs):
        guide_trace = pyro.poutine.trace(guide).get_trace(inputs)
        return pyro.poutine.replay(model, trace=guide_trace)(inputs)  # the model's output f, of one execution

    def compile_for(inputs):
        if backend == "torchscript":
            return jit_trace(outputs, ignore_warnings=True)
        with pyro.poutine.block():
            return record_for_compile(outputs, (inputs,), backend)  # one graph per shape

    same_rows, more_rows = x[:1].expand(6, -1).contiguous(), x[:1].expand(9, -1).contiguous()
    compiled = compile_for(same_rows)
    compiled(same_rows)  # compiles
    first, second = compiled(same_rows), compiled(same_rows)
    assert first.shape == (6,) and torch.unique(first).numel() == 6
    assert not torch.equal(first, second)
    compiled = compiled if backend == "torchscript" else compile_for(more_rows)
    assert torch.unique(compiled(more_rows)).numel() == 9


@pytest.mark.parametrize("backend", BACKENDS)
def test_example_seeds_under_the_jit_raises_naming_the_fix(backend):
    model, guide, x, y = _setup("whvi")
    with example_seeds(range(len(x))), pytest.raises(RuntimeError, match=r"example_seeds.*train with Trace_ELBO"):
        JitTrace_ELBO(backend=backend).loss_and_grads(model, guide, x, y)


def test_an_unknown_backend_raises_naming_the_choices():
    with pytest.raises(
        ValueError, match=r"JitTraceMeanField_ELBO: backend must be 'torchscript' .*'inductor'.*got 'fast'"
    ):
        JitTraceMeanField_ELBO(backend="fast")


def test_misuse_of_a_compiled_elbo_raises_naming_the_fix():
    model, guide, x, y = _setup("whvi")
    elbo = JitTrace_ELBO()
    elbo.loss_and_grads(model, guide, x, y)
    other_model, other_guide, _, _ = _setup("mfg")
    with pytest.raises(RuntimeError, match=r"build a new JitTrace_ELBO\(\) for each model and guide pair"):
        elbo.loss_and_grads(other_model, other_guide, x, y)
    with pyro.settings.context(module_local_params=True), pytest.raises(RuntimeError, match="module_local_params"):
        JitTraceMeanField_ELBO()(model, guide)(x, y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kl_annealing_under_the_jit_warns_that_its_factor_is_frozen(backend):
    model, guide, x, y = _setup("whvi")
    annealing = KLAnnealing(0.5)
    with pytest.warns(UserWarning, match="keeps factor=0.5"):
        JitTrace_ELBO(backend=backend).loss_and_grads(annealing(model), annealing(guide), x, y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("elbo_class", [JitTrace_ELBO, JitTraceMeanField_ELBO])
def test_kl_annealing_scope_around_a_compiled_elbo_module_scales_its_kl(elbo_class, backend):
    """``with annealing.scope(): module(x, y)`` (the engine's tempered ELBO): the compiled loss and gradients are the
    eager ELBO's under the same scope, and each factor gets its own graph (Pyro's compiled functions run the model
    and guide under ``poutine.block``, which hid the scope: every factor gave the untempered loss)."""
    model, guide, x, y = _setup("mfg")
    eager_class = Trace_ELBO if elbo_class is JitTrace_ELBO else TraceMeanField_ELBO
    module, eager = elbo_class(backend=backend)(model, guide), eager_class()(model, guide)
    losses = []
    with torch.jit.optimized_execution(False):
        for factor in (0.01, 1.0, 0.01):
            with KLAnnealing(factor).scope():
                module(x, y)  # compiles for a new factor
                reference = _module_loss_and_grads(eager, x, y, 3)
                _assert_same(_module_loss_and_grads(module, x, y, 3), reference)
                losses.append(float(reference[0]))
    assert losses[0] == losses[2] != losses[1]
    assert _graphs(module.elbo) == 2


def test_joint_optim_steps_as_pyro_optim_and_keeps_its_state():
    """One torch optimizer for every parameter gives PyroOptim's updates, and its state round-trips."""
    x, y = _data()
    results = []
    for optim in (PyroOptim(torch.optim.Adam, {"lr": 0.01}), JointOptim(torch.optim.Adam, {"lr": 0.01})):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model, guide, _, _ = _setup("whvi")
        svi = SVI(model, guide, optim, Trace_ELBO())
        losses = [svi.step(x, y) for _ in range(3)]
        results.append((losses, {name: p.detach().clone() for name, p in _parameters().items()}, optim.get_state()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-12)
    _assert_same((0.0, results[0][1]), (0.0, results[1][1]))
    assert sorted(results[0][2]) == sorted(results[1][2])  # PyroOptim's format: the states are interchangeable
    for name, state in results[0][2].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(results[1][2][name]["state"][0][key], state["state"][0][key])
    restored = JointOptim(torch.optim.Adam, {"lr": 0.01})
    restored.set_state(results[0][2])
    parameters = list(_parameters().values())
    for p in parameters:
        p.grad = None  # no step: the parameters only join the optimizer and take their state
    restored(parameters)
    for name, state in restored.get_state().items():
        torch.testing.assert_close(state["state"][0]["exp_avg"], results[0][2][name]["state"][0]["exp_avg"])
    with pytest.raises(TypeError, match="PyroOptim"):
        JointOptim(torch.optim.Adam, lambda name, param: {"lr": 0.01})
