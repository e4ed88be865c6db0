"""WHVINormal / WHVIMatrix / PlanarFlowNormal against exact answers: eq. 4 (A Sigma A^T), App. A
(matrix-normal factors), the change-of-variables density of planar flows, and Monte Carlo moments."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch
from pyro.distributions.transforms import Planar

from pyro_whvi.distributions import PlanarFlowNormal, WHVILayout, WHVIMatrix, WHVINormal

from ..helpers import scipy_hadamard, whvi_a_matrix

# (weight shape, (K, D)): square, padded input, stacked blocks with dropped rows, a conv filter
# bank read as a matrix, and a vector reshaped into one square block.
SHAPES = [
    ((8, 8), (1, 8)),
    ((8, 6), (1, 8)),
    ((18, 5), (3, 8)),
    ((3, 2, 2, 2), (1, 8)),
    ((10,), (1, 4)),
]
COVARIANCES = ("diagonal", "full", "lowrank")


def _g_distribution(kind: str, num_blocks: int, size: int):
    loc = torch.randn(num_blocks, size)
    if kind == "diagonal":
        return dist.Normal(loc, torch.rand(num_blocks, size) + 0.2).to_event(2)
    if kind == "full":
        root = torch.randn(num_blocks, size, size) / size**0.5
        cov = root @ root.mT + 0.1 * torch.eye(size)
        return dist.MultivariateNormal(loc, covariance_matrix=cov).to_event(1)
    factor = torch.randn(num_blocks, size, 2) * 0.5
    return dist.LowRankMultivariateNormal(loc, factor, torch.rand(num_blocks, size) + 0.1).to_event(1)


def _block_covariance(g_dist) -> torch.Tensor:
    base = g_dist.base_dist
    if isinstance(base, dist.Normal):
        return torch.block_diag(*torch.diag_embed(base.variance).unbind(0))
    return torch.block_diag(*base.covariance_matrix.unbind(0))


@pytest.fixture(params=SHAPES, ids=lambda p: "x".join(map(str, p[0])))
def weight_case(request):
    shape, blocks = request.param
    assert tuple(WHVILayout.for_shape(shape).block_shape) == blocks
    s1, s2 = torch.randn(*blocks), torch.randn(*blocks)
    return shape, s1, s2


@pytest.mark.parametrize("kind", COVARIANCES)
def test_mean_and_covariance_are_eq4(weight_case, kind):
    shape, s1, s2 = weight_case
    g_dist = _g_distribution(kind, *s1.shape)
    q = WHVINormal(s1, s2, g_dist, shape)
    a = whvi_a_matrix(s1, s2, shape)
    mean = a @ g_dist.mean.reshape(-1)
    cov = a @ _block_covariance(g_dist) @ a.T
    torch.testing.assert_close(q.mean.reshape(-1), mean)
    torch.testing.assert_close(q.vec_covariance(), cov)
    torch.testing.assert_close(q.variance.reshape(-1), cov.diagonal())


@pytest.mark.parametrize("kind", COVARIANCES)
def test_sampled_weights_match_the_moments(weight_case, kind):
    shape, s1, s2 = weight_case
    g_dist = _g_distribution(kind, *s1.shape)
    q = WHVINormal(s1, s2, g_dist, shape)
    num_samples = 20000
    samples = q.rsample((num_samples,)).reshape(num_samples, -1)
    mean, cov = q.mean.reshape(-1), q.vec_covariance()
    var = cov.diagonal()
    # Standard errors of the sample mean and covariance of a Gaussian; 6 sigma over <= 400 entries.
    assert ((samples.mean(0) - mean).abs() <= 6 * (var / num_samples).sqrt() + 1e-12).all()
    centred = samples - mean
    sample_cov = centred.T @ centred / num_samples
    bound = 6 * ((var[:, None] * var[None, :] + cov**2) / num_samples).sqrt() + 1e-12
    assert ((sample_cov - cov).abs() <= bound).all()


@pytest.mark.parametrize("kind", COVARIANCES)
def test_matrix_normal_factors_are_the_row_and_column_second_moments(kind):
    out_features, in_features = 18, 5
    s1, s2 = torch.randn(3, 8), torch.randn(3, 8)
    g_dist = _g_distribution(kind, 3, 8)
    q = WHVINormal(s1, s2, g_dist, (out_features, in_features))
    mean, row_cov, col_cov = q.matrix_normal_factors()
    cov = q.vec_covariance().reshape(out_features, in_features, out_features, in_features)
    expected_rows = torch.einsum("ijkj->ik", cov)  # E[(W - M)(W - M)^T]
    expected_cols = torch.einsum("ijil->jl", cov) / expected_rows.trace()  # E[(W - M)^T (W - M)] / Tr U
    torch.testing.assert_close(mean, q.mean)
    torch.testing.assert_close(row_cov, expected_rows)
    torch.testing.assert_close(col_cov, expected_cols)
    torch.testing.assert_close(col_cov.trace(), torch.tensor(1.0))


def test_paper_root_of_u_for_a_square_block():
    """App. A eq. 10: U^{1/2} = S1 H T2, T2's row i the vectorization of (Sigma^{1/2}_{ij} (H S2)_{ij'})_{j,j'}."""
    size = 8
    s1, s2 = torch.randn(1, size), torch.randn(1, size)
    g_dist = _g_distribution("full", 1, size)
    eigenvalues, vectors = torch.linalg.eigh(g_dist.base_dist.covariance_matrix[0])
    sigma_half = vectors @ torch.diag(eigenvalues.sqrt()) @ vectors.T
    hadamard = scipy_hadamard(size)
    h_s2 = hadamard * s2[0]
    t2 = torch.stack([(sigma_half[i][:, None] * h_s2[i][None, :]).T.reshape(-1) for i in range(size)])
    u_half = torch.diag(s1[0]) @ hadamard @ t2
    _, row_cov, _ = WHVINormal(s1, s2, g_dist, (size, size)).matrix_normal_factors()
    torch.testing.assert_close(u_half @ u_half.T, row_cov)


def test_matvec_matches_the_dense_weight(weight_case):
    shape, s1, s2 = weight_case
    q = WHVIMatrix(s1, s2, _g_distribution("diagonal", *s1.shape), shape)
    if len(shape) == 1:
        with pytest.raises(ValueError, match="only matrix-shaped weights"):
            q.matvec(torch.randn(3, 1))
        return
    g = q.g_dist.sample()
    x = torch.randn(7, q.layout.in_features)
    dense = q.weight(g).reshape(q.layout.out_features, -1)
    torch.testing.assert_close(q.matvec(x, g), x @ dense.T)
    per_example = q.g_dist.sample((7,))
    expected = torch.stack([q.weight(per_example[n]).reshape(q.layout.out_features, -1) @ x[n] for n in range(7)])
    torch.testing.assert_close(q.matvec(x, per_example), expected)


def test_log_prob_over_w_explains_the_degeneracy():
    q = WHVINormal(torch.ones(1, 4), torch.ones(1, 4), _g_distribution("diagonal", 1, 4), (4, 4))
    with pytest.raises(ValueError, match=r"degenerate.*density of g"):
        q.log_prob(q.sample())


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match=r"s1 and s2 of shape \(3, 8\)"):
        WHVINormal(torch.ones(1, 8), torch.ones(1, 8), _g_distribution("diagonal", 1, 8), (18, 5))
    with pytest.raises(ValueError, match="at least two entries"):
        WHVILayout.for_shape((1,), site="sigma")
    with pytest.raises(TypeError, match="Gaussian q"):
        WHVINormal(torch.ones(1, 4), torch.ones(1, 4), dist.Laplace(torch.zeros(1, 4), 1.0).to_event(2), (4, 4))


def _u_hat(u, w):
    """Rezende & Mohamed (2015), App. A.1: u_hat = u + (m(w.u) - w.u) w / |w|^2, m(a) = -1 + log(1 + e^a)."""
    wu = (w * u).sum()
    return u + (-1 + torch.log1p(torch.exp(wu)) - wu) * w / (w * w).sum()


@pytest.mark.parametrize("num_flows", [1, 3])
def test_planar_flow_density_is_the_change_of_variables(num_flows):
    num_blocks, size = 2, 4
    loc, scale = torch.randn(num_blocks, size), torch.rand(num_blocks, size) + 0.5
    flows = [Planar(num_blocks * size).double() for _ in range(num_flows)]
    q = PlanarFlowNormal(loc, scale, flows)
    torch.manual_seed(3)
    value = q.rsample()
    log_q = q.log_prob(value)

    torch.manual_seed(3)
    z0 = loc.reshape(-1) + scale.reshape(-1) * torch.randn(num_blocks * size)

    def flow_map(z):
        for flow in flows:
            z = z + _u_hat(flow.u, flow.w) * torch.tanh(flow.w @ z + flow.bias)
        return z

    jacobian = torch.autograd.functional.jacobian(flow_map, z0)
    expected = torch.distributions.Normal(loc.reshape(-1), scale.reshape(-1)).log_prob(z0).sum()
    expected = expected - torch.linalg.slogdet(jacobian)[1]
    torch.testing.assert_close(value.reshape(-1), flow_map(z0))
    torch.testing.assert_close(log_q, expected)
    with pytest.raises(ValueError, match="no closed-form inverse"):
        q.log_prob(value.clone())


def test_planar_flow_normal_is_a_transformed_distribution_with_its_own_cache():
    """Pyro's TransformedDistribution (shapes, support, reparameterized draws); log_prob knows the last
    rsample() of this distribution, whatever else went through the shared flows since."""
    loc, scale = torch.randn(2, 4), torch.rand(2, 4) + 0.5
    flows = [Planar(8).double() for _ in range(2)]
    q = PlanarFlowNormal(loc, scale, flows)
    assert isinstance(q, dist.TransformedDistribution) and q.has_rsample
    assert q.batch_shape == torch.Size() and q.event_shape == (2, 4)
    assert q.support.event_dim == 2
    assert q.expand((3,)).batch_shape == (3,)  # Pyro's ExpandedDistribution: the informative plate errors

    value = q.rsample((3,))
    assert value.shape == (3, 2, 4)
    expected = q.log_prob(value)
    assert expected.shape == (3,)
    other_value, other_log_q = PlanarFlowNormal(loc, scale, flows).rsample_with_log_prob((5,))
    assert other_value.shape == (5, 2, 4) and other_log_q.shape == (5,)
    PlanarFlowNormal(loc, scale, flows).rsample()  # another distribution over the same flows
    q.rsample_with_log_prob((2,))  # a draw that leaves q's cache alone (per-example noise)
    torch.testing.assert_close(q.log_prob(value), expected)

    q.rsample()  # a newer draw of q itself: only the last one has a known density
    with pytest.raises(ValueError, match=r"no closed-form inverse.*last value drawn"):
        q.log_prob(value)


def test_planar_flow_normal_argument_errors():
    loc, scale = torch.zeros(2, 4), torch.ones(2, 4)
    with pytest.raises(TypeError, match=r"flows\[0\] must be a pyro Planar"):
        PlanarFlowNormal(loc, scale, [dist.transforms.ExpTransform()])
    with pytest.raises(ValueError, match=r"flows\[1\] acts on 6 dims, the latent has 8"):
        PlanarFlowNormal(loc, scale, [Planar(8), Planar(6)])
