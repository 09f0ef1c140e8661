"""The Hypothesis profiles of the property tests (tests/reader/test_*_properties.py,
tests/job/sources/test_manifest_properties.py), loaded on import:

    make test   the "quick" profile: a few hundred examples per property, in seconds
    make fuzz   the "long" one (HYPOTHESIS_PROFILE=long): tens of thousands, minutes

A folder whose conftest imports this module gets them for all its tests; a property file
elsewhere imports it itself.
"""

import os

from hypothesis import HealthCheck, settings

# deadline off: a machine under load (CI runs two things at once) must not turn slowness into failures
settings.register_profile("quick", max_examples=250, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=20_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
