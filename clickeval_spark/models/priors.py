"""Beta priors on click-model parameters: every M-step is a posterior mode, value = (num + k m) / (den + k).

m is the prior mean, k its strength (in impressions); one `FamilyPrior` per parameter family. Kinds:
``none`` (k = 0, the plain MLE), ``pyclick`` (k = 2, m = 0.5 everywhere: PyClick's +1 / +2) and
``beta`` (qd families shrink toward their pooled mean; k from the grid or empirical Bayes, chosen on
the valid split). Why and how each is chosen: README, "Priors (maximum a posteriori EM)".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Mapping, Sequence

import numpy as np

from clickeval_spark.models.base import INIT_VALUE, ClickModel

PRIOR_KINDS = ("none", "pyclick", "beta")
SEEN_MEANS = ("pooled", "rank")
#: the strength grid searched by `k: auto` (pseudo-impressions), log-spaced
DEFAULT_K_GRID = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


class Strength(StrEnum):
    """The grid entry of `k: auto` beside its numbers: each family's strength by empirical Bayes."""
    EB = "eb"


#: the strength used by `k: auto` when the fit has no valid split to choose on.
#: On the TREC Session 2014 sample and on the synthetic default log the valid-split
#: choice lands between 2 and 8 for the EM models (README, "Priors").
DEFAULT_K = 4.0
# passes during which pooled prior means follow the fit; after them m is fixed (`em.candidates.Candidate.advance`)
DEFAULT_WARMUP = 20
#: on a log of more SERPs (training + valid), `k: auto`'s candidates compete on a sample of whole queries of
#: about this many (`em.driver._select_on_sample`), so the grid's cost does not grow with the log; 100,000 and
#: 250,000 chose another PBM prior on the 10M benchmark log (benchmarks/RESULTS.md)
DEFAULT_SELECT_SERPS = 1_000_000
#: successive halving of `k: auto`'s candidates, {iteration: margin}: once they have scored that iteration's
#: parameters on the valid split, a candidate whose valid LL per position trails the leader's by more than the
#: margin stops there and is out of the choice (`em.selection.halve`). The margins shrink as the candidates'
#: valid LL settle; measured on every candidate's valid LL at every pass (benchmarks/RESULTS.md, "Successive
#: halving"), the winner trailed by at most 0.72 of its round's margin
DEFAULT_HALVING = {6: 2e-3, 8: 1e-3, 12: 3e-4, 16: 1e-4}
#: fit.prior.reuse.margin: how far (nats per valid position) today's valid LL of a reused choice may lie from
#: the reused fit's before the whole selection runs again
DEFAULT_REUSE_MARGIN = 1e-3
#: the strengths empirical Bayes chooses from, per family: 0.25 * sqrt(2)^j up to 4096
EB_GRID = tuple(0.25 * 2 ** (j / 2) for j in range(29))
#: PyClick's estimator: +1 / +2 in every update
PYCLICK_K, PYCLICK_M = 2.0, 0.5
_LOG_EPS = 1e-12


@dataclass(frozen=True)
class FamilyPrior:
    """The prior of one parameter family: strength k (0 = none) and mean m (None = pooled)."""

    k: float
    m: float | None = None


@dataclass(frozen=True)
class ModelPrior:
    """A model's priors: one per qd family and one per global family.

    ``kind`` names where they came from (none / pyclick / beta, or "mixed" when
    families were configured differently); ``auto`` lists the families whose
    strength is chosen on the valid split (their k here is a placeholder);
    ``eb`` the families whose strength is their empirical Bayes estimate, updated
    by the fit while their prior means are.
    """

    kind: str
    qd: Mapping[str, FamilyPrior]
    glob: Mapping[str, FamilyPrior]
    auto: tuple[str, ...] = ()
    #: pairs unseen in training take their pooled qd family's mean at the rank they are shown at
    rank_means: bool = True
    eb: tuple[str, ...] = ()
    #: what a seen pair of a pooled qd family is shrunk toward, one variant per candidate fit: "pooled" (m) or
    #: "rank" (the impression-weighted mean of its ranks' means); several: the valid split chooses
    seen_means: tuple[str, ...] = ("pooled",)

    @property
    def seen_by_rank(self) -> bool:
        """Seen pairs shrink toward their ranks' means (the first variant, when the fit does not choose)."""
        return self.seen_means[0] == "rank"
    def with_k(self, k: float) -> "ModelPrior":
        """This prior with strength ``k`` in every auto family."""
        return self.with_strengths({p: k for p in self.auto})

    def with_eb(self) -> "ModelPrior":
        """This prior with every auto family's strength left to empirical Bayes (`DEFAULT_K` until estimated)."""
        return replace(self.with_k(DEFAULT_K), eb=self.auto)

    def with_strengths(self, ks: Mapping[str, float]) -> "ModelPrior":
        """This prior with family f's strength ks[f]; no family left to the valid split."""
        qd = {p: FamilyPrior(float(ks[p]), f.m) if p in ks else f for p, f in self.qd.items()}
        glob = {p: FamilyPrior(float(ks[p]), f.m) if p in ks else f for p, f in self.glob.items()}
        return replace(self, qd=qd, glob=glob, auto=())

    def qd_arrays(self, params: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(k, fixed m or NaN where pooled), each (P,), in ``params`` order."""
        k = np.array([float(self.qd[p].k) for p in params])
        m = np.array([np.nan if self.qd[p].m is None else float(self.qd[p].m) for p in params])
        return k, m


def family_prior(kind: str, k: float, pooled: bool) -> FamilyPrior:
    """``pooled``: the family has several values per pool (qd families; per-rank families of 2 dims)."""
    if kind == "none":
        return FamilyPrior(0.0)
    if kind == "pyclick":
        return FamilyPrior(PYCLICK_K, PYCLICK_M)
    if kind == "beta":
        return FamilyPrior(float(k)) if pooled else FamilyPrior(0.0)
    raise ValueError(f"prior kind {kind!r} is not one of {PRIOR_KINDS}")


def is_per_rank(model: ClickModel, name: str, M: int) -> bool:
    """True if the global family's shape grows with the list length (its first axis is the rank)."""
    return model.global_shapes(M)[name] != model.global_shapes(M + 1)[name]


def _pooled_global(model: ClickModel, name: str, M: int) -> bool:
    return is_per_rank(model, name, M) and len(model.global_shapes(M)[name]) >= 2


def model_prior(model: ClickModel, M: int, kind: str = "beta", k: float | str = "auto",
                overrides: Mapping[str, tuple[str, float | str]] | None = None,
                rank_means: bool = True, seen_means: Sequence[str] = ("pooled",)) -> ModelPrior:
    """Resolve a model's priors: ``kind`` / ``k`` for every family, ``overrides`` per family name."""
    overrides = overrides or {}
    kinds: set[str] = set()
    auto: list[str] = []

    def one(name: str, pooled: bool) -> FamilyPrior:
        fam_kind, fam_k = overrides.get(name, (kind, k))
        kinds.add(fam_kind)
        if fam_k == "auto" and fam_kind == "beta" and pooled:
            auto.append(name)
        return family_prior(fam_kind, DEFAULT_K if fam_k == "auto" else float(fam_k), pooled)

    qd = {p: one(p, True) for p in model.qd_params}
    glob = {g: one(g, _pooled_global(model, g, M)) for g in sorted(model.global_shapes(M))}
    bad = sorted(set(seen_means) - set(SEEN_MEANS))
    if bad or not seen_means:
        raise ValueError(f"seen_means: one or more of {SEEN_MEANS}, got {list(seen_means)}")
    return ModelPrior(kinds.pop() if len(kinds) == 1 else "mixed", qd, glob, tuple(auto), rank_means,
                      seen_means=tuple(seen_means))


def posterior_mode(num: np.ndarray, den: np.ndarray, prev: np.ndarray, k, m) -> np.ndarray:
    """The M-step: (num + k m) / (den + k); with k = 0 the ratio, keeping ``prev`` where den = 0.

    ``k`` and ``m`` broadcast against ``num`` (scalars, or (P, 1) for a stack of families).
    """
    k = np.asarray(k, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    total = den + k
    ok = total > 0
    return np.where(ok, (num + k * m) / np.where(ok, total, 1.0), prev)


def log_prior(values: np.ndarray, k, m) -> float:
    """sum of k m ln(v) + k (1 - m) ln(1 - v): the Beta log density up to a constant (0 where k = 0)."""
    k = np.asarray(k, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    v = np.clip(values, _LOG_EPS, 1 - _LOG_EPS)
    terms = np.where(k > 0, k * (m * np.log(v) + (1 - m) * np.log1p(-v)), 0.0)
    return float(terms.sum())


def ratio_or(num: np.ndarray, den: np.ndarray, fallback) -> np.ndarray:
    """num / den, and ``fallback`` where den is 0 (no data)."""
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), fallback)


def pooled_rank_means(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """A per-rank family's pooled mean of each rank (over its other axes), broadcastable to its shape."""
    axes = tuple(range(1, num.ndim))
    return ratio_or(num.sum(axis=axes, keepdims=True), den.sum(axis=axes, keepdims=True), INIT_VALUE)


def pooled_rank_mean(sums: np.ndarray, fallback: float) -> np.ndarray:
    """A qd family's pooled mean by rank from its (num..., den...) rank sums; ``fallback`` at ranks never shown."""
    return ratio_or(*np.split(np.asarray(sums, dtype=np.float64), 2), fallback)


def eb_strength(evidence: np.ndarray) -> float | None:
    """The `EB_GRID` strength with the largest log evidence (the first on a tie); None without evidence."""
    evidence = np.asarray(evidence, dtype=np.float64)
    if not evidence.any() or not np.isfinite(evidence).all():
        return None
    return float(EB_GRID[int(np.argmax(evidence))])


def pooled_mean(num: float, den: float) -> float:
    """A qd family's pooled estimate: the value every pair would get if they shared one parameter."""
    return float(num / den) if den > 0 else INIT_VALUE
