"""``python -m kafka_changelog.cli``: the same as the ``kafka-changelog`` script."""

import sys

from .main import main

sys.exit(main())
