#!/usr/bin/env bash
# Submit one stage of the pipeline from deploy/package.sh's artefacts, in client deploy mode:
#   deploy/cluster/submit.sh STAGE [spark-submit options ...] [-- job arguments ...]
#   deploy/cluster/submit.sh ingest --master spark://HOST:7077 -- --conf dist/conf/cluster.yaml --run-id r1
# DIST (default: dist/ of this checkout) holds the artefacts; SPARK_SUBMIT (default: spark-submit on
# PATH) is a Spark 4.0 launcher. Executors unpack the packed venv as ./environment in their working
# directories and run its Python; the code comes from the --py-files zip, which precedes the venv's
# copy of the package on sys.path. The driver's Python starts on this host before any archive is
# unpacked, so it is DRIVER_ENV/bin/python: the same archive unpacked here once (default
# DIST/driver-env; deploy/package.sh clears it with the rest of DIST), hence the same code and
# dependencies as the executors, and nothing from a checkout or a dev venv.
# Standalone clusters run Python drivers in client mode only; on YARN or Kubernetes, cluster deploy
# mode would set spark.pyspark.driver.python=./environment/bin/python instead.
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
DRIVER_ENV=${DRIVER_ENV:-$DIST/driver-env}
[ -f "$DIST/jobs/$stage.py" ] || { echo "submit.sh: no job $DIST/jobs/$stage.py (run deploy/package.sh)" >&2; exit 2; }
if [ ! -x "$DRIVER_ENV/bin/python" ]; then
  rm -rf "$DRIVER_ENV.partial" && mkdir -p "$DRIVER_ENV.partial"
  tar -xzf "$DIST/clickeval_venv.tar.gz" -C "$DRIVER_ENV.partial"
  rm -rf "$DRIVER_ENV" && mv "$DRIVER_ENV.partial" "$DRIVER_ENV"
fi

exec "${SPARK_SUBMIT:-spark-submit}" \
  --deploy-mode client \
  --packages io.delta:delta-spark_2.13:4.0.1 \
  --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
  --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
  --archives "$DIST/clickeval_venv.tar.gz#environment" \
  --py-files "$DIST/clickeval_spark.zip" \
  --conf spark.pyspark.python=./environment/bin/python \
  --conf "spark.pyspark.driver.python=$DRIVER_ENV/bin/python" \
  "${submit_opts[@]}" \
  "$DIST/jobs/$stage.py" "$@"
