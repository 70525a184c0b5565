"""Check registry: each check reads only run artifacts (docs/artifacts.md) and returns a result
whose message names the step, tensor or sample at fault."""

from harness.checks import (  # noqa: F401
    accounting,
    autoscale,
    checkpoints,
    elastic,
    faults,
    interrupts,
    learning,
    mismatch,
    parity,
    placement,
    throughput,
    weights,
)
from harness.checks.base import CHECKS, CheckContext, CheckParams, CheckResult, Status, parse_check

__all__ = ["CHECKS", "CheckContext", "CheckParams", "CheckResult", "Status", "parse_check"]
