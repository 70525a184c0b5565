"""Scenario suite: ``pytest scenarios/`` (options: ``pytest scenarios/ --help``, group relax-harness)."""

pytest_plugins = ["harness.pytest_plugin"]
