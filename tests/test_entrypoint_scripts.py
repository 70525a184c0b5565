"""The launch helpers of scripts/entrypoint/ (seed 001's single-node and multi-node launch).

Each script is valid bash, and with ``RELAX_DRY_RUN=1`` prints the commands it would run, quoted for a
shell: every ``ray start`` / ``ray job submit`` option it uses is one that Ray's CLI has, and the relax
flags it passes (its own and the user's) parse as ``relax train`` flags.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from relax.utils.arguments import parse_args

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts" / "entrypoint"
USER_FLAGS = ["--preset", "quickstart", "--resource", '{"actor": [1, 4], "rollout": [1, 4]}', "--num-rollout", "2"]


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_scripts_are_valid_bash(script: str) -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _dry_run(script: str, *args: str, source: bool = False, **env: str) -> list[list[str]]:
    """The commands ``script`` prints under RELAX_DRY_RUN=1, each split as a shell would."""
    full_env = {**os.environ, "RELAX_DRY_RUN": "1", **env}
    if source:  # as a run script uses local.sh: source it, then run the train command it set up
        cmd = ["bash", "-c", f'source {shlex.quote(str(SCRIPTS / script))} && _relax_train_command "$@"', "x", *args]
    else:
        cmd = ["bash", str(SCRIPTS / script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines() if line.strip()]


@cache
def _ray_options(*subcommand: str) -> set[str]:
    ray = str(Path(sys.executable).with_name("ray"))
    out = subprocess.run([ray, *subcommand, "--help"], capture_output=True, text=True, timeout=120).stdout
    return set(re.findall(r"(?m)^\s+(--[a-z][a-z-]*)", out))


def _check_ray(command: list[str]) -> None:
    assert command[0] == "ray"
    sub = command[1:3] if command[1] == "job" else command[1:2]
    known = _ray_options(*sub)
    ray_part = command[:command.index("--")] if "--" in command else command
    used = {token for token in ray_part if token.startswith("--")}
    assert used <= known, f"ray {' '.join(sub)} has no {sorted(used - known)}"


def _relax_flags(command: list[str]) -> list[str]:
    train = next(i for i, token in enumerate(command) if token.endswith("relax/entrypoints/train.py"))
    assert Path(command[train]) == REPO / "relax" / "entrypoints" / "train.py"
    return command[train + 1:]


def test_local_starts_a_head_then_trains() -> None:
    head, train = _dry_run("local.sh", *USER_FLAGS)
    assert head[:3] == ["ray", "start", "--head"] and "--block" in head
    _check_ray(head)
    assert _relax_flags(train) == USER_FLAGS
    parse_args(_relax_flags(train))


def test_local_sourced_and_submitted() -> None:
    head, submit = _dry_run("local.sh", *USER_FLAGS, source=True, RELAX_SUBMIT="1", NUM_GPUS="4", NUM_CPUS="8")
    assert "--block" not in head and head[head.index("--num-gpus") + 1] == "4"  # left running for the caller
    _check_ray(head)
    assert submit[:3] == ["ray", "job", "submit"]
    _check_ray(submit)
    parse_args(_relax_flags(submit))


def test_spmd_head_and_worker() -> None:
    env = {"MASTER_ADDR": "node-0", "HOST_IP": "10.0.0.1", "NUM_GPUS": "4", "WORLD_SIZE": "2"}
    head, submit = _dry_run("spmd-multinode.sh", *USER_FLAGS, POD_NAME="node-0", **env)
    assert head[:3] == ["ray", "start", "--head"]
    _check_ray(head)
    _check_ray(submit)
    flags = _relax_flags(submit)
    assert flags[:2] == ["--num-gpus-per-node", "4"] and flags[2:] == USER_FLAGS
    assert parse_args(flags).num_gpus_per_node == 4
    [worker] = _dry_run("spmd-multinode.sh", *USER_FLAGS, POD_NAME="node-1", **env)
    assert worker[:4] == ["ray", "start", "--address", "node-0:6379"] and "--block" in worker
    _check_ray(worker)


def test_spmd_needs_its_environment() -> None:
    proc = subprocess.run(["bash", str(SCRIPTS / "spmd-multinode.sh")], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "POD_NAME", "HOST_IP")})
    assert proc.returncode != 0 and "set MASTER_ADDR" in proc.stderr


def test_ray_job_mode_joins_the_running_cluster() -> None:
    [train] = _dry_run("ray-job.sh", *USER_FLAGS)
    parse_args(_relax_flags(train))
