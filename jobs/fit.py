"""Fit: the configured click models on the train split (distributed EM); write model_params."""

import sys

from clickeval_spark.runtime import run_job
from clickeval_spark.stages import fit_stage


def main(argv=None) -> int:
    return run_job("fit", argv, fit_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
