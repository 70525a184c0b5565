"""xfail markers for scenarios whose engine feature is not built yet: strict, so they turn red
(XPASS) the day the feature lands and the marker must go."""

import pytest


def waits(reason: str):
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


dp2 = waits("waits for a data-parallel torch trainer (not filed yet): --resource actor replicas > 1 is not supported")
