"""What a keyed state is and how it is written as bytes: kinds, descriptors, serializers,
TTL declarations, schema evolution, and the codecs of state ops and key-group snapshots.

The lowest sub-package of :mod:`kafka_changelog.state`: it imports none of the others
(only :mod:`kafka_changelog.state.errors`).
"""
