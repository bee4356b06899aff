"""Bulk matching of update batches on Spark (PySpark DataFrames).

Nothing lives here yet: the Spark matcher is built in its own issue, on top of the matching
core (broker.matching) and the partitioning (broker.partition) it must agree with.
"""
