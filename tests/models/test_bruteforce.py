"""Kernels against an independent brute-force oracle.

For each model the generative story is written out again, plainly, as a
recursion over ranks that branches on every hidden variable (examination E,
attractiveness A, satisfaction S, relevance R, going on to the next rank).  The
leaves ("worlds") carry their probability, the click pattern and the hidden
values, so joint, marginal and conditional click probabilities, and the
posteriors behind the EM statistics, are plain sums over worlds.  Nothing here
calls a kernel except to compare with it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from clickeval_spark.models import MODELS, get_model
from clickeval_spark.models.base import log_likelihood

GARBAGE = 0.77  # parameter value at padded ranks: must not leak into any result


def bern(p, x):
    return p if x else 1.0 - p


def enumerate_worlds(n, step, state0):
    """All leaves of the generative tree: (prob, clicks, hidden per rank).

    step(r, state) yields (prob, click, hidden_dict, next_state) branches.
    """
    out = []

    def rec(r, state, p, clicks, hidden):
        if p == 0.0:
            return
        if r == n:
            out.append((p, tuple(clicks), hidden))
            return
        for q, c, h, nxt in step(r, state):
            rec(r + 1, nxt, p * q, clicks + [c], hidden + [h])

    rec(0, state0, 1.0, [], [])
    return out


# --- generative stories, one per model ------------------------------------------------
# qd: per-rank values for this SERP (dict name -> list); g: global arrays.

def story_gctr(qd, g, n):
    def step(r, _):
        for c in (0, 1):
            yield bern(g["ctr"], c), c, {}, None
    return enumerate_worlds(n, step, None)


def story_rctr(qd, g, n):
    def step(r, _):
        for c in (0, 1):
            yield bern(g["ctr"][r], c), c, {}, None
    return enumerate_worlds(n, step, None)


def story_dctr(qd, g, n):
    def step(r, _):
        for c in (0, 1):
            yield bern(qd["alpha"][r], c), c, {}, None
    return enumerate_worlds(n, step, None)


def story_pbm(qd, g, n):
    def step(r, _):
        for e, a in itertools.product((0, 1), repeat=2):
            p = bern(g["gamma"][r], e) * bern(qd["alpha"][r], a)
            yield p, e * a, {"e": e, "a": a}, None
    return enumerate_worlds(n, step, None)


def story_ubm(qd, g, n):
    def step(r, last):  # last: 1-based rank of the last click so far, 0 if none
        for e, a in itertools.product((0, 1), repeat=2):
            p = bern(g["gamma"][r, last], e) * bern(qd["alpha"][r], a)
            c = e * a
            yield p, c, {"e": e, "a": a, "last": last}, (r + 1 if c else last)
    return enumerate_worlds(n, step, 0)


def story_cm(qd, g, n):
    def step(r, exam):
        for a in (0, 1):
            c = exam * a
            yield bern(qd["alpha"][r], a), c, {"e": exam, "a": a}, int(exam and not c)
    return enumerate_worlds(n, step, 1)


def story_dcm(qd, g, n):
    def step(r, exam):
        for a in (0, 1):
            pa = bern(qd["alpha"][r], a)
            if not exam:
                yield pa, 0, {"e": 0, "a": a, "go": 0}, 0
            elif not a:  # examined, skipped: DCM always goes on
                yield pa, 0, {"e": 1, "a": 0, "go": 1}, 1
            else:
                for go in (0, 1):
                    yield pa * bern(g["lambda"][r], go), 1, {"e": 1, "a": 1, "go": go}, go
    return enumerate_worlds(n, step, 1)


def story_ccm(qd, g, n):
    t1, t2, t3 = g["tau"]

    def step(r, exam):
        al = qd["alpha"][r]
        for a in (0, 1):
            pa = bern(al, a)
            if not exam:
                yield pa, 0, {"e": 0, "a": a, "go": 0}, 0
            elif not a:
                for go in (0, 1):
                    yield pa * bern(t1, go), 0, {"e": 1, "a": 0, "go": go}, go
            else:
                for rel, go in itertools.product((0, 1), repeat=2):
                    p = pa * bern(al, rel) * bern(t3 if rel else t2, go)
                    yield p, 1, {"e": 1, "a": 1, "rel": rel, "go": go}, go
    return enumerate_worlds(n, step, 1)


def story_dbn(qd, g, n, gamma=None):
    gam = g["gamma"] if gamma is None else gamma

    def step(r, exam):
        for a in (0, 1):
            pa = bern(qd["alpha"][r], a)
            if not exam:
                yield pa, 0, {"e": 0, "a": a, "s": 0, "go": 0}, 0
            elif not a:
                for go in (0, 1):
                    yield pa * bern(gam, go), 0, {"e": 1, "a": 0, "s": 0, "go": go}, go
            else:
                for s in (0, 1):
                    ps = pa * bern(qd["sigma"][r], s)
                    if s:  # satisfied: stop
                        yield ps, 1, {"e": 1, "a": 1, "s": 1, "go": 0}, 0
                    else:
                        for go in (0, 1):
                            yield ps * bern(gam, go), 1, {"e": 1, "a": 1, "s": 0, "go": go}, go
    return enumerate_worlds(n, step, 1)


def story_sdbn(qd, g, n):
    return story_dbn(qd, g, n, gamma=1.0)


STORIES = {
    "gctr": story_gctr, "rctr": story_rctr, "dctr": story_dctr, "pbm": story_pbm,
    "ubm": story_ubm, "cm": story_cm, "dcm": story_dcm, "ccm": story_ccm,
    "dbn": story_dbn, "sdbn": story_sdbn,
}


def random_params(model, B, W, rng, lo=0.05, hi=0.95):
    qd = {name: rng.uniform(lo, hi, size=(B, W)) for name in model.qd_params}
    g = {name: rng.uniform(lo, hi, size=shape) for name, shape in model.global_shapes(W).items()}
    return qd, g


def table(worlds, n):
    """pattern -> P(pattern); every one of the 2^n patterns present."""
    t = {c: 0.0 for c in itertools.product((0, 1), repeat=n)}
    for p, c, _ in worlds:
        t[c] += p
    return t


def posterior(worlds, pattern, fn):
    """E[fn(hidden) | clicks == pattern]."""
    num = sum(p * fn(h) for p, c, h in worlds if c == pattern)
    den = sum(p for p, c, _ in worlds if c == pattern)
    return num / den


def setup(name, n, seed, B=4):
    """B SERPs of n real ranks padded to W = n + 1 (last column masked)."""
    model = get_model(name)
    rng = np.random.default_rng(seed)
    W = n + 1
    qd, g = random_params(model, B, W, rng)
    for v in qd.values():
        v[:, n] = GARBAGE
    mask = np.zeros((B, W), dtype=bool)
    mask[:, :n] = True
    worlds = [STORIES[name]({k: v[b] for k, v in qd.items()}, g, n) for b in range(B)]
    return model, qd, g, mask, worlds


def pattern_batch(qd, mask, n):
    """Every (SERP, pattern) pair as one row, qd repeated accordingly."""
    B, W = mask.shape
    patterns = list(itertools.product((0, 1), repeat=n))
    rows_b = np.repeat(np.arange(B), len(patterns))
    clicks = np.zeros((len(rows_b), W), dtype=np.int8)
    clicks[:, :n] = np.array(patterns * B, dtype=np.int8)
    rep_qd = {k: v[rows_b] for k, v in qd.items()}
    return rows_b, patterns * B, clicks, mask[rows_b], rep_qd


CASES = [(name, n) for name in sorted(MODELS) for n in range(1, 6)]


@pytest.mark.parametrize("name,n", CASES)
def test_probabilities_match_enumeration(name, n):
    model, qd, g, mask, worlds = setup(name, n, seed=1000 + 17 * n + len(name))
    B = mask.shape[0]

    tabs = [table(w, n) for w in worlds]
    for t in tabs:
        assert sum(t.values()) == pytest.approx(1.0, abs=1e-12)

    # Marginal click probabilities.
    cp = model.click_probs(qd, g, mask)
    for b in range(B):
        expect = [sum(p * c[r] for c, p in tabs[b].items()) for r in range(n)]
        np.testing.assert_allclose(cp[b, :n], expect, atol=1e-12)
    assert np.all(cp[:, n] == 0.0)

    # Conditionals P(C_r = 1 | c_<r) and the chain-rule likelihood of every pattern.
    rows_b, pats, clicks, rmask, rqd = pattern_batch(qd, mask, n)
    cond = model.cond_probs(rqd, g, clicks, rmask)
    ll = log_likelihood(cond, clicks, rmask, eps=1e-300)
    for i, (b, c) in enumerate(zip(rows_b, pats)):
        t = tabs[b]
        for r in range(n):
            prefix = sum(p for cc, p in t.items() if cc[:r] == c[:r])
            if prefix < 1e-12:  # conditioning on an impossible prefix (CM after a click)
                continue
            hit = sum(p for cc, p in t.items() if cc[:r] == c[:r] and cc[r] == 1)
            assert cond[i, r] == pytest.approx(hit / prefix, abs=1e-12), (b, c, r)
        assert cond[i, n] == 0.0
        assert np.exp(ll[i]) == pytest.approx(t[c], abs=1e-12), (b, c)


def test_cm_gives_zero_probability_to_a_second_click():
    model, qd, g, mask, worlds = setup("cm", 3, seed=5)
    clicks = np.zeros(mask.shape, dtype=np.int8)
    clicks[:, 0] = 1
    cond = model.cond_probs(qd, g, clicks, mask)
    np.testing.assert_allclose(cond[:, 0], qd["alpha"][:, 0])
    assert np.all(cond[:, 1:] == 0.0)


# --- expected statistics of the EM models against enumerated posteriors -------------

def oracle_stats(name, worlds, c, n, W):
    """Per-SERP num/den that exact EM must produce for one observed pattern c."""
    P = lambda fn: posterior(worlds, c, fn)  # noqa: E731
    qd_num = {}
    qd_den = {}
    glob_num = {}
    glob_den = {}
    has_next = [r < n - 1 for r in range(n)]
    a_post = [P(lambda h, r=r: h[r]["a"]) for r in range(n)]

    if name in ("pbm", "ubm", "dcm", "dbn", "sdbn"):
        qd_num["alpha"] = a_post
        qd_den["alpha"] = [1.0] * n
    if name == "pbm":
        glob_num["gamma"] = np.zeros(W)
        glob_den["gamma"] = np.zeros(W)
        for r in range(n):
            glob_num["gamma"][r] = P(lambda h, r=r: h[r]["e"])
            glob_den["gamma"][r] = 1.0
    if name == "ubm":
        glob_num["gamma"] = np.zeros((W, W + 1))
        glob_den["gamma"] = np.zeros((W, W + 1))
        last = 0
        for r in range(n):
            glob_num["gamma"][r, last] += P(lambda h, r=r: h[r]["e"])
            glob_den["gamma"][r, last] += 1.0
            last = r + 1 if c[r] else last
    if name == "dcm":
        glob_num["lambda"] = np.zeros(W)
        glob_den["lambda"] = np.zeros(W)
        for r in range(n):
            if c[r] and has_next[r]:
                glob_num["lambda"][r] = P(lambda h, r=r: h[r]["go"])
                glob_den["lambda"][r] = 1.0
    if name == "ccm":
        num, den = list(a_post), [1.0] * n
        tnum, tden = np.zeros(3), np.zeros(3)
        for r in range(n):
            if not has_next[r]:
                continue
            if c[r]:
                p_rel = P(lambda h, r=r: h[r]["rel"])
                num[r] += p_rel
                den[r] += 1.0
                tnum[1] += P(lambda h, r=r: (1 - h[r]["rel"]) * h[r]["go"])
                tden[1] += 1.0 - p_rel
                tnum[2] += P(lambda h, r=r: h[r]["rel"] * h[r]["go"])
                tden[2] += p_rel
            else:
                tnum[0] += P(lambda h, r=r: h[r]["e"] * h[r]["go"])
                tden[0] += P(lambda h, r=r: h[r]["e"])
        qd_num["alpha"], qd_den["alpha"] = num, den
        glob_num["tau"], glob_den["tau"] = tnum, tden
    if name in ("dbn", "sdbn"):
        snum, sden = [0.0] * n, [0.0] * n
        gnum = gden = 0.0
        for r in range(n):
            if not has_next[r]:
                continue
            if c[r]:
                snum[r] = P(lambda h, r=r: h[r]["s"])
                sden[r] = 1.0
            gnum += P(lambda h, r=r: h[r]["go"])
            gden += P(lambda h, r=r: h[r]["e"] * (1 - h[r]["s"]))
        qd_num["sigma"], qd_den["sigma"] = snum, sden
        if name == "dbn":
            glob_num["gamma"], glob_den["gamma"] = np.array(gnum), np.array(gden)
    return qd_num, qd_den, glob_num, glob_den


EM_CASES = [(name, n) for name in ("pbm", "ubm", "dcm", "ccm", "dbn", "sdbn") for n in range(1, 6)]


@pytest.mark.parametrize("name,n", EM_CASES)
def test_expected_stats_match_enumerated_posteriors(name, n):
    model, qd, g, mask, worlds = setup(name, n, seed=2000 + 31 * n + len(name), B=3)
    W = mask.shape[1]
    rows_b, pats, clicks, rmask, rqd = pattern_batch(qd, mask, n)
    for i, (b, c) in enumerate(zip(rows_b, pats)):
        one = slice(i, i + 1)
        stats = model.expected_stats({k: v[one] for k, v in rqd.items()}, g,
                                     clicks[one], rmask[one])
        qn, qdn, gn, gdn = oracle_stats(name, worlds[b], c, n, W)
        assert set(stats.qd) == set(qn) and set(stats.glob) == set(gn)
        for k, (num, den) in stats.qd.items():
            np.testing.assert_allclose(num[0, :n], qn[k], atol=1e-10, err_msg=f"{k} num {c}")
            np.testing.assert_allclose(den[0, :n], qdn[k], atol=1e-10, err_msg=f"{k} den {c}")
            assert num[0, n] == 0.0 and den[0, n] == 0.0  # padding contributes nothing
        for k, (num, den) in stats.glob.items():
            assert np.shape(num) == np.shape(den) == model.global_shapes(W)[k]
            np.testing.assert_allclose(num, gn[k], atol=1e-10, err_msg=f"{k} num {c}")
            np.testing.assert_allclose(den, gdn[k], atol=1e-10, err_msg=f"{k} den {c}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_extreme_parameters_stay_well_defined(name):
    """alpha, sigma, gamma... at exactly 0 or 1 must give finite probabilities and stats."""
    model = get_model(name)
    n = 4
    W = n + 1
    patterns = np.array(list(itertools.product((0, 1), repeat=n)), dtype=np.int8)
    rng = np.random.default_rng(7)
    mask = np.zeros((len(patterns), W), dtype=bool)
    mask[:, :n] = True
    clicks = np.zeros(mask.shape, dtype=np.int8)
    clicks[:, :n] = patterns
    for trial in range(20):
        qd = {k: rng.choice([0.0, 0.3, 1.0], size=(1, W)).repeat(len(patterns), 0)
              for k in model.qd_params}
        g = {k: rng.choice([0.0, 0.6, 1.0], size=s) for k, s in model.global_shapes(W).items()}
        for arr in [model.cond_probs(qd, g, clicks, mask), model.click_probs(qd, g, mask)]:
            assert np.all(np.isfinite(arr)) and np.all(arr >= 0) and np.all(arr <= 1 + 1e-12)
        stats = model.expected_stats(qd, g, clicks, mask)
        for num, den in list(stats.qd.values()) + list(stats.glob.values()):
            assert np.all(np.isfinite(num)) and np.all(np.isfinite(den))
            assert np.all(num >= -1e-12) and np.all(num <= den + 1e-9)


def test_registry():
    assert list(MODELS) == ["gctr", "rctr", "dctr", "pbm", "cm", "ubm", "dcm", "ccm", "dbn", "sdbn"]
    for name, model in MODELS.items():
        assert model.name == name and get_model(name) is model
    assert get_model("DBN") is MODELS["dbn"]
    with pytest.raises(ValueError, match="gctr, rctr, dctr, pbm, cm, ubm, dcm, ccm, dbn, sdbn"):
        get_model("pyclick")
    assert {m.name for m in MODELS.values() if not m.iterative} == {"gctr", "rctr", "dctr", "cm"}
    # a model's counting estimator, where it has one, is another kernel of the same name and probabilities
    assert {m.name for m in MODELS.values() if m.counting is not None} == {"sdbn"}
    assert MODELS["sdbn"].counting.name == "sdbn" and not MODELS["sdbn"].counting.iterative


def test_relevance():
    qd = {"alpha": np.array([[0.4, 0.9]]), "sigma": np.array([[0.5, 0.1]])}
    for name in ("dbn", "sdbn"):
        np.testing.assert_allclose(get_model(name).relevance(qd), [[0.2, 0.09]])
    for name in ("dctr", "pbm", "cm", "ubm", "dcm", "ccm"):
        np.testing.assert_allclose(get_model(name).relevance(qd), qd["alpha"])
    for name in ("gctr", "rctr"):
        with pytest.raises(ValueError, match="no per-document parameter"):
            get_model(name).relevance({})


def test_sdbn_em_reaches_the_maximum_of_the_likelihood_its_predictions_use():
    """SDBN's EM fixed point maximises DBN's likelihood at gamma = 1, computed here by enumerating the
    generative story (no kernel): every parameter nudged either way lowers it, and the counting estimator
    (PyClick's) scores lower on the same log."""
    from tests.models.numpy_em import fit_numpy, gather, simulate

    rng = np.random.default_rng(5)
    Q, D, n, B = 2, 4, 3, 400
    q = rng.integers(0, Q, B)
    qd_index = q[:, None] * D + np.argsort(rng.random((B, D)), axis=1)[:, :n]
    mask = np.ones((B, n), dtype=bool)
    truth = {"alpha": rng.uniform(0.2, 0.8, Q * D), "sigma": rng.uniform(0.2, 0.8, Q * D)}
    clicks = simulate(get_model("dbn"), gather(truth, qd_index, mask), {"gamma": np.array(0.7)}, mask, rng)

    def enumerated_ll(values):
        total = 0.0
        for b in range(B):
            worlds = story_sdbn({k: v[qd_index[b]] for k, v in values.items()}, {}, n)
            total += np.log(table(worlds, n)[tuple(int(x) for x in clicks[b])])
        return total

    em, _, _ = fit_numpy(get_model("sdbn"), qd_index, Q * D, clicks, mask, 3000, n)
    counted, _, _ = fit_numpy(get_model("sdbn").counting, qd_index, Q * D, clicks, mask, 1, n)
    best = enumerated_ll(em)
    assert best > enumerated_ll(counted) + 1.0
    for name in em:
        for pair in range(Q * D):
            for step in (-1e-3, 1e-3):
                nudged = {k: v.copy() for k, v in em.items()}
                nudged[name][pair] = np.clip(nudged[name][pair] + step, 0.0, 1.0)
                if nudged[name][pair] != em[name][pair]:
                    assert enumerated_ll(nudged) <= best + 1e-9, (name, pair, step)
