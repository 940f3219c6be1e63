"""PySpark integration of kafka-changelog (imports pyspark; the core package never does)."""
