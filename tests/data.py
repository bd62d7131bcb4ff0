"""The real TREC Session 2014 sample the repository carries (data/trec-session-2014-demo, MIT, see its LICENSE)."""

from pathlib import Path

TREC_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "trec-session-2014-demo"
