"""The bootstrap's Poisson(1) weights as one compiled loop (numba): `bootstrap.poisson_weights`.

The numpy draws (`bootstrap.numpy_poisson_weights`) run splitmix64 over an (n, R) uint64 matrix
through a dozen temporaries and a `searchsorted`, which costs more than the two BLAS products that
weigh the statistics with them; this loop needs no temporaries (the measurements: benchmarks/RESULTS.md).
Each weight is one pass of splitmix64 and eight branch-free comparisons with the Poisson CDF, then a
scan in the rare case (~1e-5) that all eight hold. The integer arithmetic wraps as numpy's does and
the uniform is the same double, so the weights are the same integers (tests/metrics/test_bootstrap.py
compares them with the numpy draws).

Compiled on first use in each process and cached in ``__pycache__`` where that is writable, as
`em.compiled`.
"""

from __future__ import annotations

import os

import numpy as np
from numba import njit

_CACHE = os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK)


@njit(cache=_CACHE, nogil=True)
def poisson_draws(hashes: np.ndarray, cdf: np.ndarray, out: np.ndarray) -> None:
    """out (n, R + 1) int64: column 0 all ones, column r the Poisson(1) draw of splitmix64(hash + r * golden).

    hashes (n,) uint64; cdf: the Poisson(1) CDF at 0, 1, 2, ... (a draw is the number of entries <= u).
    """
    golden = np.uint64(0x9E3779B97F4A7C15)
    m1, m2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    s30, s27, s31, s11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
    unit = 1.0 / 9007199254740992.0   # 2^-53
    n_cdf = cdf.shape[0]
    for i in range(out.shape[0]):
        out[i, 0] = 1
        h = hashes[i]
        for r in range(1, out.shape[1]):
            x = h + np.uint64(r) * golden + golden
            x = (x ^ (x >> s30)) * m1
            x = (x ^ (x >> s27)) * m2
            x = x ^ (x >> s31)
            u = np.float64(x >> s11) * unit
            # branch-free over the first entries (P(draw >= 8) ~ 1e-5), then a scan
            k = 0
            for j in range(8):
                k += cdf[j] <= u
            if k == 8:
                while k < n_cdf and cdf[k] <= u:
                    k += 1
            out[i, r] = k
