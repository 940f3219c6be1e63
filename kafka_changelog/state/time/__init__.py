"""Time over the working copy: state objects whose entries expire (TTL) and timers per
key in processing and event time, both kept as keyed state.

Imports only :mod:`~kafka_changelog.state.tables` and below.
"""
