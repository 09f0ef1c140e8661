"""The reader's tests: the Hypothesis profiles of its property tests (test_*_properties.py),
registered and loaded by tests/hypothesis_profiles.py ("quick" for `make test`, "long" for
`make fuzz`)."""

import tests.hypothesis_profiles  # noqa: F401  (loads HYPOTHESIS_PROFILE, "quick" unless set)
