"""The command-line options the example streaming jobs share (clickstream, sessions)."""

from __future__ import annotations

import argparse

from spark_integration.streaming import StreamingStateConfig


def job_parser(description: str, application: str, input_topic: str, output_topic: str,
               max_per_batch: int) -> argparse.ArgumentParser:
    """A parser with the options every example job takes (topics, checkpoint directory,
    parallelism, how many input records to wait for, where Spark runs); the job adds its
    own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--application", default=application)
    parser.add_argument("--input-topic", default=input_topic)
    parser.add_argument("--output-topic", default=output_topic)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--expected-events", type=int, required=True)
    parser.add_argument("--max-per-batch", type=int, default=max_per_batch)
    parser.add_argument("--materialization-interval", type=float, default=5.0)
    parser.add_argument("--topic-prefix", default=application,
                        help="the state topics are PREFIX-changelog, -snapshots, -checkpoints")
    parser.add_argument("--local-state-dir", default=None,
                        help="host-local state directory of the rocksdb backend (default: "
                             "a temporary directory)")
    parser.add_argument("--driver-lease", type=float, default=None, metavar="SECONDS",
                        help="how long the driver's hold on the application lasts without "
                             "a heartbeat (default: StreamingStateConfig's)")
    parser.add_argument("--snapshot-sweep", type=float, nargs=2, default=None,
                        metavar=("INTERVAL", "GRACE"),
                        help="seconds between sweeps of the snapshot topic, and the grace of "
                             "chunks no checkpoint names (default: StreamingStateConfig's)")
    parser.add_argument("--master", default=None,
                        help="Spark master: local[n] (default local[max(2, parallelism)]) or "
                             "spark://host:port")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    parser.add_argument("-X", "--kafka-setting", action="append", default=[],
                        metavar="KEY=VALUE", dest="kafka_settings",
                        help="a librdkafka setting for every Kafka client, security included "
                             "(repeatable); Spark's Kafka connector gets the same security")
    return parser


def kafka_settings(args: argparse.Namespace) -> dict[str, str]:
    """``-X KEY=VALUE`` options as a dict (``ValueError`` naming one without ``=``)."""
    settings = {}
    for item in args.kafka_settings:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"-X takes KEY=VALUE, got {item!r}")
        settings[key] = value
    return settings


def state_config(args: argparse.Namespace, operator_id: str) -> StreamingStateConfig:
    """The job's state configuration from its parsed options."""
    return StreamingStateConfig(
        application=args.application, operator_id=operator_id,
        bootstrap_servers=args.bootstrap_servers, parallelism=args.parallelism,
        changelog_topic=f"{args.topic_prefix}-changelog",
        snapshot_topic=f"{args.topic_prefix}-snapshots",
        checkpoint_topic=f"{args.topic_prefix}-checkpoints",
        partitions=8, materialization_interval_s=args.materialization_interval,
        local_state_dir=args.local_state_dir, client_config=kafka_settings(args),
        **({"driver_lease_s": args.driver_lease} if args.driver_lease else {}),
        **({"snapshot_sweep_interval_s": args.snapshot_sweep[0],
            "snapshot_sweep_grace_s": args.snapshot_sweep[1]} if args.snapshot_sweep else {}))


def spark_settings(args: argparse.Namespace) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` options as a dict."""
    return dict(item.split("=", 1) for item in args.spark_conf)
