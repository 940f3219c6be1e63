"""The seeded chaos soak: the clickstream job under random faults, checked against a model."""
