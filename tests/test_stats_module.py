"""The SciPy-free statistics used by `ortspec verify` agree with SciPy."""
import numpy as np
import pytest
from scipy import stats as sps

from ortspec.stats import chi2_sf, pooled_chi_square, total_variation, tv_sampling_bound


@pytest.mark.parametrize("x,dof", [(0.5, 1), (3.0, 2), (10.0, 3), (50.0, 40), (200.0, 150), (1e-3, 5), (400, 20)])
def test_chi2_sf_matches_scipy(x, dof):
    assert chi2_sf(x, dof) == pytest.approx(sps.chi2.sf(x, dof), rel=1e-8, abs=1e-300)


def test_pooled_chi_square_matches_scipy_and_rejects_zero_cells():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(20, 5.0))  # every expected count >= 5: no pooling
    counts = rng.multinomial(5000, probs)
    p, cells, tv = pooled_chi_square(counts, probs)
    assert p == pytest.approx(sps.chisquare(counts, probs * 5000).pvalue, rel=1e-6)
    assert cells == 20 and 0 <= tv < 0.1
    sparse = rng.dirichlet(np.full(50, 0.3))  # small cells are pooled into one
    p2, cells2, _ = pooled_chi_square(rng.multinomial(5000, sparse), sparse)
    assert 2 <= cells2 < 50 and 0 < p2 <= 1
    bad = counts.copy()
    probs2 = probs.copy()
    probs2[0] = 0
    bad[0] = 1
    assert pooled_chi_square(bad, probs2)[0] == 0.0


def test_tv_bound_covers_sampling_noise():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(30))
    tvs = [total_variation(rng.multinomial(2000, probs), probs) for _ in range(200)]
    assert max(tvs) < tv_sampling_bound(30, 2000)
