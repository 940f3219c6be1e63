"""The reader: ``format("kafka-changelog")``, a checkpoint's state, changes or timers as a
DataFrame, and the change feed between checkpoints (``readStream``).

Driver side: :mod:`.datasource` (the data source Spark pickles to its workers; a batch
read), :mod:`.feed_source` (the feed's stream and batch reads between checkpoints),
planning in :mod:`.planning`, :mod:`.packing`, :mod:`.pushdown`, :mod:`.selected_plan`,
:mod:`.feed_planning` and :mod:`.checkpoint_changes`. Worker side, without pyspark:
:mod:`.task_reading` and :mod:`.feed_reading` (one input partition), :mod:`.scan`
(offset slices, snapshot chunks), :mod:`.rows`, :mod:`.timer_rows`,
:mod:`.change_columns`, :mod:`.change_arrow` (Arrow batches; the ops' fields are read by
:mod:`kafka_changelog.state.schema.op_columns`, which restores use too), the
schemas (:mod:`.change_schema`, :mod:`.feed_schema`) and :mod:`.worker_gc`.

The reader never imports :mod:`spark_integration.streaming` (running a query) and is
never imported by it. Both may use :mod:`spark_integration.sessions` and the contracts at
the top of the package that the state's writer and its reader share:
:mod:`spark_integration.keys` (key bytes as Spark SQL) and
:mod:`spark_integration.checkpoint_properties` (what a batch records in its checkpoint).
This file imports nothing, so that Spark's Python workers import the worker-side modules
without pyspark; the public names (``register``, ``KafkaChangelogDataSource``) are
exported by :mod:`spark_integration`.
"""
