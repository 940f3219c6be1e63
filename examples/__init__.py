"""An example application of kafka-changelog (not part of the package; run it from the
repository root).

- :mod:`.clickstream`: the clickstream job, a Structured Streaming query keeping
  per-user state with kafka-changelog and writing its outputs exactly once
  (``python -m examples.clickstream``);
- :mod:`.streaming_demo`: the main job (``./scripts/demo.sh``, or ``python -m
  examples.streaming_demo``): the clickstream job killed, restarted at another
  parallelism, and its state and outputs checked;
- :mod:`.changelog_demo`: a smaller, Spark-free round trip of the changelog storage
  alone (``python -m examples.changelog_demo``);
- :mod:`.events`: the click events all of them use.
"""
