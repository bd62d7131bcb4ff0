"""PySpark's Python worker daemon, without Python 3.10/3.11's per-task re-read of every zip on sys.path.

Before every task PySpark's worker calls ``importlib.invalidate_caches()`` (worker_util.setup_spark_files).
On Python 3.10 and 3.11 that makes every ``zipimporter`` re-read its archive's whole directory at once:
pyspark.zip once per package path imported from it, py4j's zip and the spark-core jar Spark puts on the
workers' PYTHONPATH: most of a small task's time (benchmarks/RESULTS.md). Python 3.12 only marks the cache
stale on invalidation (gh-103200); this module gives 3.10/3.11 the same effect: an archive's directory is
re-read when the file changed (mtime, ctime, size or inode), not on every call. Then it runs
``pyspark.daemon`` unchanged.

Used as ``spark.python.daemon.module`` (`clickeval_spark.session.build_session` sets it for the embedded
mode, where the workers run this venv's Python). The module must be importable by the executors'
Python: on a cluster, set it in the config only when they run the PEX (deploy/package.sh).
"""

from __future__ import annotations

import os
import runpy
import sys
import zipimport


def _stamp(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino


def patch_zipimport() -> bool:
    """Make `zipimport.zipimporter.invalidate_caches` re-read an archive only when it changed; True if patched.

    Every directory read records the archive's stamp, taken before reading, against the directory it
    produced (importers of one archive share a directory until one re-reads). An importer re-reads
    when its directory's stamp is no longer the archive's, or when its directory was read before
    this patch (unknown: read once more, at patch time for the importers that exist then).
    """
    if not (3, 10) <= sys.version_info[:2] < (3, 12):
        return False
    if getattr(zipimport.zipimporter.invalidate_caches, "_clickeval", False):
        return True
    read_directory, reread = zipimport._read_directory, zipimport.zipimporter.invalidate_caches
    # id(directory) -> (stamp, directory); holding the directory keeps its id from being reused
    stamps: dict[int, tuple[tuple[int, ...] | None, dict]] = {}

    def recorded_read(archive):
        stamp = _stamp(archive)
        files = read_directory(archive)
        stamps[id(files)] = (stamp, files)
        return files

    def invalidate_caches(self) -> None:
        stamp, files = stamps.get(id(self._files), (None, None))
        if files is not self._files or _stamp(self.archive) != stamp:
            reread(self)

    invalidate_caches._clickeval = True
    zipimport._read_directory = recorded_read
    zipimport.zipimporter.invalidate_caches = invalidate_caches
    for finder in list(sys.path_importer_cache.values()):
        if isinstance(finder, zipimport.zipimporter):
            finder.invalidate_caches()
    return True


if __name__ == "__main__":
    patch_zipimport()
    # sys.argv[1:] (the worker module, if Spark passes one) is left as pyspark.daemon expects it
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
