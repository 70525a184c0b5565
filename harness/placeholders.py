"""Placeholders in scenario flags (and fault targets), filled when a run is launched.

``{output_dir}`` (this run's dir), ``{scenario_dir}``, ``{run:NAME}`` (another run's dir), ``{proxy:NAME}`` (a
fault proxy), ``{server:NAME}`` (an engine server the scenario started, kind ``engine_server``) and
``{relax_tasks}`` (the bundled task datasets, relax/models/tasks), ``{relax_autoscaler}`` (the bundled autoscaler
configs, relax/utils/autoscaler). A leaf module: the spec (harness/spec.py)
and the faults that name addresses (harness/faults/proxy.py) both use it.
"""

from __future__ import annotations

import re

PLACEHOLDER = re.compile(r"\{(output_dir|scenario_dir|relax_tasks|relax_autoscaler|run:[\w.-]+|proxy:[\w.-]+|server:[\w.-]+)\}")


def substitute(flags: list[str], values: dict[str, str]) -> list[str]:
    """``flags`` with every placeholder replaced by its value; an unknown one raises naming it and its flag."""

    def one(flag: str) -> str:
        def rep(m: re.Match[str]) -> str:
            if m.group(1) not in values:
                raise KeyError(f"unknown placeholder {{{m.group(1)}}} in flag {flag!r}")
            return values[m.group(1)]

        return PLACEHOLDER.sub(rep, flag)

    return [one(f) for f in flags]
