"""The Python a build of clickeval-spark needs, and the check a job runs before it imports anything else.

deploy/package.sh records what it built with in ``clickeval_spark/_build.py`` (``BUILD``: the Python
minor version the artefacts need, the one they were built with, the git commit, the pex version), in
the wheel, the zip and the PEX alike, and in ``DIST/BUILD_INFO.json`` for operators. A checkout has no
``_build.py``: it needs pyproject's ``requires-python`` (3.11). Standard library only: the check runs
before numpy or pyspark are imported, which an interpreter of another minor version may not have.
"""

from __future__ import annotations

import platform
import sys

# pyproject's requires-python (>=3.11,<3.12), for a checkout; a build records its own
CHECKOUT_PYTHON = "3.11"


def recorded() -> dict:
    """What deploy/package.sh recorded for this build; a checkout: only the Python it needs."""
    try:
        from clickeval_spark._build import BUILD
    except ImportError:
        return {"python": CHECKOUT_PYTHON}
    return dict(BUILD)


def found_python() -> tuple[str, str]:
    """This interpreter's version (3.11.7) and path."""
    return platform.python_version(), sys.executable


def python_problem() -> str | None:
    """One line saying what this build needs and what runs it, when its minor version is not the build's."""
    build = recorded()
    version, executable = found_python()
    if version.split(".")[:2] == build["python"].split("."):
        return None
    built_with = f" (built with {build['built_with']})" if build.get("built_with") else ""
    return f"clickeval: this build needs Python {build['python']}{built_with}, found {version} at {executable}"
