"""``python -m ci.gate RESULTS_JSON --baselines ci/baselines [--summary FILE]`` (see harness.gate)."""

import sys

from harness.gate import judge, main, markdown

__all__ = ["judge", "main", "markdown"]

if __name__ == "__main__":
    sys.exit(main())
