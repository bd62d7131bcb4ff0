"""Distributed EM for click models on Spark: the fit stage's engine.

The log is packed once into query blocks (`blocks`, `codec`); the driver loop (`driver`) runs candidate
fits in lockstep passes through an engine (`passes.Passes`: `stage_passes` or `resident`); every pass runs
the block step (`step`, `sums`) on every block, and only per-rank / global sums reach the driver. The
equations are the kernels' (`clickeval_spark.models`).
"""

from clickeval_spark.em.blocks import PackedLog, pack_log, pack_serps
from clickeval_spark.em.driver import fit, fit_groups
from clickeval_spark.em.options import EMOptions

__all__ = ["EMOptions", "PackedLog", "fit", "fit_groups", "pack_log", "pack_serps"]
