"""PySpark's Python worker daemon, without Python 3.10/3.11's per-task re-read of every zip on sys.path.

Before every task PySpark's worker calls ``importlib.invalidate_caches()`` (worker_util.setup_spark_files).
On Python 3.10 and 3.11 that makes every ``zipimporter`` re-read its archive's whole directory at once:
pyspark.zip once per package path imported from it, py4j's zip and the spark-core jar Spark puts on the
workers' PYTHONPATH. Measured here: about 0.2 s per task (a trivial 32-task mapPartitions took 3.4 s on
2 cores), most of a small task's time. CPython fixed it in 3.12 (gh-103200: invalidation only marks the
cache stale); this module gives 3.10/3.11 the same effect: an archive's directory is re-read when the
file changed (size or mtime), not on every call. Then it runs ``pyspark.daemon`` unchanged.

Used as ``spark.python.daemon.module`` (`clickeval_spark.session.build_session` sets it for the embedded
mode, where the workers run this venv's Python). The module must be importable by the executors'
Python: on a cluster, set it in the config only when they run the packed venv (deploy/package.sh).
"""

from __future__ import annotations

import os
import runpy
import sys
import zipimport

_UNSEEN = object()


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def patch_zipimport() -> bool:
    """Make `zipimport.zipimporter.invalidate_caches` re-read an archive only when it changed; True if patched."""
    if not (3, 10) <= sys.version_info[:2] < (3, 12):
        return False
    reread = zipimport.zipimporter.invalidate_caches
    if getattr(reread, "_clickeval", False):
        return True

    def invalidate_caches(self) -> None:
        # per importer: each package path inside an archive has its own importer and its own copy
        stamp, seen = _stamp(self.archive), getattr(self, "_clickeval_stamp", _UNSEEN)
        self._clickeval_stamp = stamp
        # the first call only records the stamp: the importer read the directory when it was made
        if seen is not _UNSEEN and seen != stamp:
            reread(self)

    invalidate_caches._clickeval = True
    zipimport.zipimporter.invalidate_caches = invalidate_caches
    return True


if __name__ == "__main__":
    patch_zipimport()
    # sys.argv[1:] (the worker module, if Spark passes one) is left as pyspark.daemon expects it
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
