"""Generate: synthetic_serps, K sampled click sequences per test SERP per generator model and variant."""

import sys

from clickeval_spark.runtime import run_job
from clickeval_spark.stages import generate_stage


def main(argv=None) -> int:
    return run_job("generate", argv, generate_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
