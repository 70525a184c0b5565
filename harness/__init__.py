"""Scenario harness for relax: specs, executors, faults, checks, baselines and reports.

Importing ``harness`` is cheap and starts nothing. Entry points: ``python -m harness`` /
``relax-harness`` (CLI), ``harness.pytest_plugin`` (pytest), ``harness.runner.run_scenario``.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
