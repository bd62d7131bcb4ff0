"""A fitted click model and what is done with it: predict clicks, score relevance, sample click sequences,
store and read its parameters (`model_params`). `attach` brings per-(query, doc) parameters to SERPs."""

from clickeval_spark.fitted.model import FittedModel

__all__ = ["FittedModel"]
