"""Surrogate: distributional_metrics, Reverse / Forward PPL of each generator's synthetic sequences."""

import sys

from clickeval_spark.runtime import run_job
from clickeval_spark.stages import surrogate_stage


def main(argv=None) -> int:
    return run_job("surrogate", argv, surrogate_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
