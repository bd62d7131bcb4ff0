#!/usr/bin/env bash
# Submit one stage of the pipeline from deploy/package.sh's artefacts, in client deploy mode:
#   deploy/cluster/submit.sh STAGE [spark-submit options ...] [-- job arguments ...]
#   deploy/cluster/submit.sh ingest --master spark://HOST:7077 -- --conf dist/conf/cluster.yaml --run-id r1
# DIST (default: dist/ of this checkout) holds the artefacts; SPARK_SUBMIT (default: spark-submit on
# PATH) is a Spark 4.0 launcher. Driver and executors run the same PEX as their Python: --files puts
# it in each executor's working directory (spark.pyspark.python=./clickeval.pex), the driver runs it
# from DIST on this host. Each finds a CPython 3.11 on its host's PATH (PEX_PYTHON_PATH), wherever it
# is installed. The code and its dependencies come from the PEX alone (no --py-files: one copy of
# clickeval_spark per process, never a checkout or a dev venv); pyspark and py4j from Spark's own zips.
# Standalone clusters run Python drivers in client mode only; on YARN or Kubernetes, cluster deploy
# mode would set spark.pyspark.driver.python=./clickeval.pex instead.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,3p "$0" >&2; exit 2; }
stage=$1
shift
submit_opts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  submit_opts+=("$1")
  shift
done
[ $# -gt 0 ] && shift

DIST=$(cd "${DIST:-$(dirname "$0")/../../dist}" && pwd)
[ -f "$DIST/jobs/$stage.py" ] || { echo "submit.sh: no job $DIST/jobs/$stage.py (run deploy/package.sh)" >&2; exit 2; }
[ -f "$DIST/clickeval.pex" ] || { echo "submit.sh: no $DIST/clickeval.pex (run deploy/package.sh)" >&2; exit 2; }

exec "${SPARK_SUBMIT:-spark-submit}" \
  --deploy-mode client \
  --packages io.delta:delta-spark_2.13:4.0.1 \
  --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
  --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
  --files "$DIST/clickeval.pex" \
  --conf spark.pyspark.python=./clickeval.pex \
  --conf "spark.pyspark.driver.python=$DIST/clickeval.pex" \
  "${submit_opts[@]}" \
  "$DIST/jobs/$stage.py" "$@"
