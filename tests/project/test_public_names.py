"""``spark_integration``'s public names (listed once, in its ``if TYPE_CHECKING:``
imports) all load, and importing the package alone does not import pyspark."""

from __future__ import annotations

import subprocess
import sys


def test_every_public_name_of_spark_integration_loads_on_first_use() -> None:
    code = (
        "import sys, spark_integration as s\n"
        "assert 'pyspark' not in sys.modules, 'the package imported pyspark'\n"
        "assert len(s.__all__) > 10, s.__all__\n"
        "missing = [n for n in s.__all__ if getattr(s, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
