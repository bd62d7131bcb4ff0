"""SQUAREM's extrapolation of three successive EM points: the arithmetic the block step (qd values) and the
driver (global parameters) share (`acceleration` runs the cycles)."""

from __future__ import annotations

import numpy as np

#: an extrapolated probability stays this far inside (0, 1), unless its third point already lies outside
EXTRAPOLATION_MARGIN = 1e-6


def extrapolated(p0: np.ndarray, p1: np.ndarray, p2: np.ndarray, alpha: float) -> np.ndarray:
    """SQUAREM's extrapolation (Varadhan & Roland 2008, scheme S3) of three successive EM points by step length
    ``alpha`` >= 1: p0 + 2 alpha r + alpha^2 v, r = p1 - p0, v = p2 - 2 p1 + p0 (alpha = 1 gives p2), held
    inside (0, 1) by `EXTRAPOLATION_MARGIN`: every parameter of these models is a probability."""
    r, v = p1 - p0, p2 - 2 * p1 + p0
    out = p0 + 2 * alpha * r + alpha * alpha * v
    return np.clip(out, np.minimum(EXTRAPOLATION_MARGIN, p2), np.maximum(1 - EXTRAPOLATION_MARGIN, p2))
