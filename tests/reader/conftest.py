"""The reader's tests: Hypothesis profiles for the property tests (test_tfrecord_properties.py).

    make test   the "quick" profile: a few hundred streams per property, in seconds
    make fuzz   the "long" one (HYPOTHESIS_PROFILE=long): tens of thousands, minutes
"""

import os

from hypothesis import HealthCheck, settings

# deadline off: a machine under load (CI runs two things at once) must not turn slowness into failures
settings.register_profile("quick", max_examples=250, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=20_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
