"""Materialized state: snapshot handles and stores, the materialization schedule,
delta layers, and the rules of the snapshot-chunk sweep.

Imports only :mod:`~kafka_changelog.state.tables` and below.
"""
