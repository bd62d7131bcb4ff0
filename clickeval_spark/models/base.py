"""The click-model kernel contract: vectorised numpy maths over a batch of SERPs.

Spark code (EM driver, predictor, sampler) never knows a model's equations; it
hands a kernel numpy arrays for a batch of SERPs and aggregates what comes back.
That keeps every model's maths in one small, testable place and lets the same
kernel run inside `mapInPandas` on a cluster and in a plain numpy reference.

Array conventions (every model, every method):
- B SERPs, padded to M ranks. ``mask[b, r]`` is True where rank r+1 exists.
- ``clicks`` is an int8 (B, M) array of 0/1, 0 where masked.
- ``qd[name]`` is a float64 (B, M) array: the value of a per-(query, doc)
  parameter for the document shown at that rank (any value where masked).
- ``g[name]`` is a float64 array of shape ``global_shapes(M)[name]``: per-rank
  or global parameters (a few hundred numbers at most).

Every parameter is re-estimated by a ratio of expected counts (EM M-step or
counting MLE): new = sum(num) / sum(den), summed over all impressions of a
(query, doc) pair for ``qd`` parameters, and over the whole log for global ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

INIT_VALUE = 0.5  # PyClick's starting value for every parameter
LL_EPS = 1e-6     # probabilities are clipped to [LL_EPS, 1 - LL_EPS] in every log-likelihood


@dataclass
class Stats:
    """Expected sufficient statistics of one batch.

    qd:   name -> (num, den), each (B, M); summed later per (query, doc).
    glob: name -> (num, den), each of the parameter's global shape, already
          summed over the batch.
    """

    qd: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    glob: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


class ClickModel(ABC):
    #: lower-case name used in config and in every table's `model` column
    name: str
    #: per-(query, doc) parameter names, e.g. ("alpha",) or ("alpha", "sigma")
    qd_params: tuple[str, ...] = ()
    #: False for counting estimators (CTRs, CM, `sdbn.CountedSDBN`): one pass gives the MLE
    iterative: bool = True
    #: a counting estimator of the same probabilities that is not their MLE (SDBN's, PyClick's): the fit
    #: under ``prior: pyclick``, and under any other prior a second fit the valid split may choose
    counting: ClickModel | None = None
    #: qd parameters whose E-step den is the impression itself (1 at every shown rank, as in
    #: PBM's and UBM's attractiveness): EM counts their dens once per block, not in every pass
    impression_dens: tuple[str, ...] = ()
    #: an examination model: C_r = E_r * A_r, A_r ~ qd "alpha", E_r ~ global "gamma" at the flat index
    #: ``row_constants()["cell"]`` (gamma.size where masked). EM runs its passes through the compiled
    #: `compiled.examination_pass` instead of the numpy E-step
    examination_cells: bool = False
    #: `relevance` takes the global parameters too (``relevance(qd, g)``): a learned model's weights
    relevance_uses_globals: bool = False

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        """Per-rank / global parameter shapes for lists of length M."""
        return {}

    def init_global(self, M: int) -> dict[str, np.ndarray]:
        return {k: np.full(s, INIT_VALUE) for k, s in self.global_shapes(M).items()}

    @abstractmethod
    def cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                   clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """P(C_r = 1 | observed clicks at ranks < r), shape (B, M)."""

    @abstractmethod
    def click_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                    mask: np.ndarray) -> np.ndarray:
        """P(C_r = 1) with earlier clicks marginalised, shape (B, M)."""

    @abstractmethod
    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        """E-step (or counting pass): num/den for every parameter.

        ``weight`` (B,): how many identical SERPs each row stands for (a folded log,
        `em.codec.pack_block`); the global sums count each row that many times. The qd
        arrays stay per row: the caller weights them as it sums them per pair.
        """

    def row_constants(self, clicks: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """Arrays the kernel derives from the clicks alone, each with one entry per row (axis 0).

        The clicks never change during a fit, so EM computes a block's once (`em.step.BlockArrays`) and
        hands each slice's back as ``const`` to `estep_and_log_likelihood` and `scored_log_likelihood`,
        instead of the kernel deriving them again in every pass. Empty unless a kernel overrides this.
        """
        return {}

    def estep_and_log_likelihood(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                                 clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None,
                                 const: Mapping[str, np.ndarray] | None = None) -> tuple[Stats, np.ndarray]:
        """`expected_stats` and the per-SERP `log_likelihood` under the same parameters: what an EM pass needs.

        A kernel whose E-step already computes P(C_r = 1 | clicks above) overrides this to
        reuse it instead of running `cond_probs` again (the LL is a large share of a pass: benchmarks/RESULTS.md).
        ``const``: the batch's `row_constants`, or None.
        """
        return (self.expected_stats(qd, g, clicks, mask, weight),
                self.scored_log_likelihood(qd, g, clicks, mask, const))

    def scored_log_likelihood(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray], clicks: np.ndarray,
                              mask: np.ndarray, const: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """The per-SERP `log_likelihood` alone (held-out SERPs, a fit's last pass); ``const`` as above."""
        return log_likelihood(self.cond_probs(qd, g, clicks, mask), clicks, mask)

    def relevance(self, qd: Mapping[str, np.ndarray]) -> np.ndarray:
        """Relevance score of a (query, doc): attractiveness unless overridden."""
        return qd["alpha"]


def row_weight(weight: np.ndarray | None) -> np.ndarray | float:
    """A kernel's ``weight`` as a (B, 1) column that scales per-position terms before a global sum; 1.0 if None."""
    return 1.0 if weight is None else np.asarray(weight, dtype=np.float64)[:, None]


def binned_sums(bins: np.ndarray, n: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Per bin 0..n-1, the sum of ``weights`` (default 1) of the positions in it; positions in the spare bin n
    (masked ranks) are dropped. Whole rows go to bincount, so no boolean gather per pass, and every real
    bin adds the same terms in the same order as a sum over the unmasked positions alone."""
    return np.bincount(bins, weights=weights, minlength=n + 1)[:n]


def sample_clicks(model: ClickModel, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                  mask: np.ndarray, u: np.ndarray, deterministic: bool = False) -> np.ndarray:
    """Draw click sequences rank by rank: C_r = [u_r < P(C_r=1 | sampled clicks above)].

    The chain rule makes this exact for every model, given only `cond_probs`.
    `u` holds uniforms in [0, 1), shape (B, M); with ``deterministic`` a rank is
    clicked when its conditional probability exceeds 0.5 (u is ignored).
    """
    clicks = np.zeros(mask.shape, dtype=np.int8)
    for r in range(mask.shape[1]):
        p = model.cond_probs(qd, g, clicks, mask)[:, r]
        hit = (p > 0.5) if deterministic else (u[:, r] < p)
        clicks[:, r] = (hit & mask[:, r]).astype(np.int8)
    return clicks


def log_likelihood(p_cond: np.ndarray, clicks: np.ndarray, mask: np.ndarray,
                   eps: float = LL_EPS) -> np.ndarray:
    """Per-SERP log P(clicks) = sum_r log P(C_r = c_r | clicks above), natural log."""
    # P(C_r = c_r) first, then one log per rank: half the transcendental calls of log(p) beside
    # log1p(-p) (the LL is a large share of an EM pass); clipping 1 - p equals 1 - clipping p up to rounding
    q = np.where(clicks == 1, p_cond, 1.0 - p_cond)
    np.log(np.clip(q, eps, 1 - eps, out=q), out=q)
    return np.where(mask, q, 0.0).sum(axis=1)
