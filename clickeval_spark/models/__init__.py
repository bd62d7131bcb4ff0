"""Click models: numpy kernels behind one contract (see base.py), and a registry."""

from __future__ import annotations

from enum import StrEnum

from clickeval_spark.models.base import ClickModel, Stats
from clickeval_spark.models.ccm import CCM
from clickeval_spark.models.cm import CM
from clickeval_spark.models.ctr import DCTR, GCTR, RCTR
from clickeval_spark.models.dbn import DBN
from clickeval_spark.models.dcm import DCM
from clickeval_spark.models.lcm import LCM
from clickeval_spark.models.pbm import PBM
from clickeval_spark.models.sdbn import SDBN
from clickeval_spark.models.ubm import UBM

# Kernels are stateless, so one shared instance per model is enough.
MODELS: dict[str, ClickModel] = {
    m.name: m for m in (GCTR(), RCTR(), DCTR(), PBM(), CM(), UBM(), DCM(), CCM(), DBN(), SDBN())
}
#: learned models: trained by a distributed learner (clickeval_spark.learned), not by EM; the same kernel contract
#: for predict, sample and relevance. Apart from MODELS, which is the EM registry (fits, surrogates, simulations)
LEARNED: dict[str, ClickModel] = {m.name: m for m in (LCM(),)}


class Engine(StrEnum):
    """How a fit runs its EM passes (`em.EMOptions.engine`): one Spark job per pass, every pass in one barrier
    stage (`em.resident.ResidentPasses`), or the second where the cluster allows it."""
    AUTO = "auto"
    STAGES = "stages"
    RESIDENT = "resident"


#: the engines' names, as the config spells them
ENGINES = tuple(e.value for e in Engine)


def get_model(name: str) -> ClickModel:
    try:
        key = name.strip().lower()
        return MODELS[key] if key in MODELS else LEARNED[key]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown click model {name!r}; expected one of: "
                         + ", ".join([*MODELS, *LEARNED])) from None


__all__ = ["MODELS", "LEARNED", "ENGINES", "Engine", "get_model", "ClickModel", "Stats",
           "GCTR", "RCTR", "DCTR", "PBM", "CM", "UBM", "DCM", "CCM", "DBN", "SDBN", "LCM"]
