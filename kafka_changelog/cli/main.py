"""The ``kafka-changelog`` console script: argument parsing and dispatch.

Exit codes: 0 done; 1 the command ran and found a problem (``verify``), nothing
(``state`` of a key without state) or refused (``reset`` or ``rewind`` of a live
application, or without ``--yes``); 2 an error (bad arguments, Kafka unreachable, unknown
application, ...), printed on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException

from ..errors import ChangelogError
from ..kafka.error_text import describe
from . import applications, broker, fork, handles, input_offsets, reset, rewind, state, verify
from .options import add_connection_options, add_json_option, add_topic_options

DESCRIPTION = """\
Operate kafka-changelog applications and look at handles and topics.

  kafka-changelog broker                       a local Kafka on localhost:9092 (Ctrl-C stops it)
  kafka-changelog -b HOST:PORT applications    applications in the checkpoint topic
  kafka-changelog -b HOST:PORT checkpoints APP their retained checkpoints
  kafka-changelog -b HOST:PORT state APP --operator OP --key K
  kafka-changelog -b HOST:PORT verify APP      restore every subtask, report problems
  kafka-changelog -b HOST:PORT reset APP --yes delete an application's state
  kafka-changelog -b HOST:PORT rewind APP --to N --yes  go back to checkpoint N
  kafka-changelog -b HOST:PORT fork APP NEW    start NEW from APP's latest checkpoint
  kafka-changelog -b HOST:PORT input-offsets APP  the input APP's state holds
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="kafka-changelog", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_options(parser, nested=False)
    add_topic_options(parser, nested=False)
    # Commands repeat the shared options so they may also follow the command name.
    connection = argparse.ArgumentParser(add_help=False)
    add_connection_options(connection, nested=True)
    application = argparse.ArgumentParser(add_help=False)
    add_connection_options(application, nested=True)
    add_topic_options(application, nested=True)
    add_json_option(application)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker.register(commands)
    applications.register(commands, [application])
    state.register(commands, [application])
    verify.register(commands, [application])
    reset.register(commands, [application])
    rewind.register(commands, [application])
    fork.register(commands, [application])
    input_offsets.register(commands, [application])
    handles.register(commands, [connection])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kafka-changelog`` console script."""
    args = build_parser().parse_args(argv)
    try:
        result: int = args.func(args)
        return result
    except ChangelogError as exc:
        print(f"kafka-changelog: error: {exc}", file=sys.stderr)
        return 2
    except KafkaException as exc:  # a client call the library did not wrap
        error = exc.args[0] if exc.args else None
        shown = describe(error) if isinstance(error, KafkaError) else str(exc)
        print(f"kafka-changelog: error: Kafka: {shown}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
