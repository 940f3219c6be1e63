"""Real Spark for tests and demos: a local standalone cluster (:mod:`.standalone`)."""
