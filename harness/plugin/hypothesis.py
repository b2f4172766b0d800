"""The hypothesis profiles, picked by ``HYPOTHESIS_PROFILE`` (default: ``default``).

"default" is deterministic, so a CI failure replays by running again (derandomize implies no
example database); "dev" is a quick random search and "fuzz" a long one, both keeping failures in
the example database (``.hypothesis/examples``), which replays them first on the next run. Every
failure also prints its ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from harness import ROOT

EXAMPLE_DATABASE = DirectoryBasedExampleDatabase(str(ROOT / ".hypothesis" / "examples"))
settings.register_profile(
    "default",
    max_examples=40,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", max_examples=10, deadline=None, database=EXAMPLE_DATABASE, print_blob=True
)
settings.register_profile(
    "fuzz",
    max_examples=2000,
    deadline=None,
    database=EXAMPLE_DATABASE,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
settings.load_profile(HYPOTHESIS_PROFILE)
#: Examples of each request-boundary property (each runs a whole request through the target's
#: engine, 0.2 to 2 s on a 2-core CPU), sized to the profile's time budget per property and
#: target: default 60 s, dev 20 s, fuzz 30 min.
REQUEST_EXAMPLES = {"default": 10, "dev": 4, "fuzz": 1000}.get(HYPOTHESIS_PROFILE, 10)
