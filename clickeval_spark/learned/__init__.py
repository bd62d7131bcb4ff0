"""The learned click model (`models.lcm`): features from the training log in Spark SQL (features.py), trained
on the executors by Spark MLlib (train.py), stored and used as a FittedModel like the classic ten."""

from clickeval_spark.learned.train import LearnerOptions, train_lcm

__all__ = ["LearnerOptions", "train_lcm"]
