"""The checkpoint properties a Spark batch records: the query and the batch that committed
it, and the states it declared.

Streaming writes them with every checkpoint it commits
(:mod:`spark_integration.streaming.batch_identity` tells a new batch from a re-run by them;
:mod:`spark_integration.streaming.state_declarations` checks declarations against the
recorded registrations); the reader's change feed reads them back (every row's
``batch_id``, :mod:`spark_integration.reader.feed_schema`) and the state writer checks its
declarations as streaming does (:mod:`spark_integration.writer`). Every side holds this
contract, so it lives at the top of the package, beside :mod:`spark_integration.keys`, and
imports nothing of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from kafka_changelog.state.errors import StateSchemaError
from kafka_changelog.state.schema.evolution import evolve_meta
from kafka_changelog.state.schema.ops import StateMeta
from kafka_changelog.state.time.ttl_state import check_ttl_unchanged

#: The id Spark keeps in the query's ``checkpointLocation``.
QUERY_ID = "spark.query_id"
#: The Spark batch id.
BATCH_ID = "spark.batch_id"
#: Checkpoint properties ``state.<name>``: a declared state's registration (JSON).
STATE_PROPERTY_PREFIX = "state."


def recorded_metas(properties: Mapping[str, str]) -> dict[str, StateMeta]:
    """The registrations a checkpoint's properties record (``state.<name>``)."""
    return {name[len(STATE_PROPERTY_PREFIX):]: StateMeta.from_record(json.loads(value))
            for name, value in properties.items() if name.startswith(STATE_PROPERTY_PREFIX)}


def evolved_metas(application: str, operator: str, recorded: Mapping[str, str],
                  requested: Sequence[StateMeta], dropped: Sequence[str] = ()
                  ) -> dict[str, StateMeta]:
    """The registrations of ``recorded`` (a checkpoint's properties) but ``dropped``, with
    each of ``requested`` evolved over its recorded one (a TTL neither added nor removed);
    :class:`~kafka_changelog.state.errors.StateSchemaError` names the application, operator
    and state when a request cannot read what was written."""
    known = recorded_metas(recorded)
    metas = {name: meta for name, meta in known.items() if name not in dropped}
    for meta in requested:
        try:
            check_ttl_unchanged(known.get(meta.state), meta)
            metas[meta.state] = evolve_meta(known.get(meta.state), meta)
        except ValueError as e:
            raise StateSchemaError(
                f"application {application!r}, operator {operator!r}: {e}") from e
    return metas


def state_properties(metas: Mapping[str, StateMeta]) -> dict[str, str]:
    """The ``state.<name>`` checkpoint properties recording ``metas``."""
    return {STATE_PROPERTY_PREFIX + name: json.dumps(meta.to_record(), sort_keys=True)
            for name, meta in sorted(metas.items())}


__all__ = ["BATCH_ID", "QUERY_ID", "STATE_PROPERTY_PREFIX", "evolved_metas", "recorded_metas",
           "state_properties"]
