"""Tests of the PySpark integration (real Spark, real broker)."""
