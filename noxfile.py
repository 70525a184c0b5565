"""Developer and CI sessions. `nox -s demo` and `nox -s tests` are the README's two commands.

CPU sessions install torch from the CPU wheel first (`torch==2.13.0`), so pip never resolves
a multi-GB CUDA build; the package's own `torch>=2.4` requirement is then already met.
GPU sessions run in the machine's own Python (torch with CUDA is preinstalled there).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ci.sessions: what the scenario sessions run and write
from ci.sessions import AB_RESULTS, BASELINE_RUNS, SESSIONS, TESTS_JUNIT  # noqa: E402

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

CPU_TORCH = "torch==2.13.0"
PYTHON = "3.11"
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def _install(session: nox.Session, extras: str = "dev") -> None:
    session.install(CPU_TORCH)
    session.install("-e", f".[{extras}]")


def _pytest(session: nox.Session, *args: str) -> None:
    # pytest exits 5 when it collected nothing: for us that is a broken selection, not a pass.
    session.run("pytest", *args, *session.posargs, env=SINGLE_THREAD, success_codes=[0])


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Unit and integration tests of relax/ and harness/ (CPU, 3 workers). ``--dist loadscope``: each module's tests
    run on one worker, so a module-scoped ``relax train`` fixture runs once, not once per worker (~10% less CPU).

    3 workers on the 2-core CI machine: much of an end-to-end test is waiting (a Ray actor starting, a bounded
    timeout, a fake engine's step); tests/test_waits.py alone uses 49 CPU-seconds in its 145 s. On 2026-11-30,
    same machine, same commit, pytest took 1,324 s with 2 workers and 1,143 s with 3, the cores 98.6% busy (a 4th
    worker would only queue)."""
    _install(session)
    _pytest(session, "-n", "3", "--dist", "loadscope", "tests", "-m", "not gpu and not multi_gpu", f"--junitxml={TESTS_JUNIT}")


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The quickstart: a tiny offline GRPO run that visibly learns (CPU, a few minutes)."""
    _install(session, extras="dev")
    out = os.environ.get("RELAX_DEMO_DIR", "runs/quickstart")
    session.run("rm", "-rf", out, external=True)
    session.run("relax", "train", "--preset", "quickstart", "--output-dir", out, env=SINGLE_THREAD)
    session.run("python", "-m", "relax.metrics.summary", out)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "relax", "harness", "tests", "scenarios", "ci", "noxfile.py")


def _scenario_session(session: nox.Session, name: str, python: str = "python", extra: tuple[str, ...] = ()) -> None:
    """pytest over scenarios/ with the harness plugin, then the regression gate (ci/sessions.py says how)."""
    spec = SESSIONS[name]
    _pytest(session, *spec.pytest_args(), *extra)
    session.run(python, *spec.gate_args())


@nox.session(python=PYTHON)
def scenarios(session: nox.Session) -> None:
    """CPU variants of every scenario family (local executor), then the regression gate. Throughput without
    a baseline for this machine class is reported as such (`nox -s baselines` records one)."""
    _install(session)
    _scenario_session(session, "scenarios")


@nox.session(venv_backend="none")
def gpu_scenarios(session: nox.Session) -> None:
    """GPU variants in this machine's own Python (CUDA torch preinstalled; ray etc. via ci/wheelhouse); a
    throughput check without a stored baseline for this GPU class fails (--harness-require-baselines)."""
    docker = ("--harness-executor", "docker") if os.environ.get("RELAX_HARNESS_DOCKER_GPU") else ()
    _scenario_session(session, "gpu_scenarios", python=sys.executable, extra=docker)


@nox.session(python=PYTHON)
def baselines(session: nox.Session) -> None:
    """Record this machine class's CPU throughput baselines (5 runs of each scenario with a throughput check)
    into ci/baselines/; arguments go to `relax-harness baseline record`. On the GPU machine (no nox there):
    ``python3 -m harness baseline record --profile gpu`` (ci/gpu_session.sh ``baselines``)."""
    _install(session)
    session.run("relax-harness", "baseline", "record", "--results", BASELINE_RUNS, *session.posargs,
                env=SINGLE_THREAD)


@nox.session(python=PYTHON)
def ab(session: nox.Session) -> None:
    """Same-machine A/B throughput gate of this checkout against a base commit:
    ``nox -s ab -- --base origin/main [--scenario NAME --runs N]`` (arguments go to `relax-harness ab`)."""
    _install(session)
    if not any(a == "--base" or a.startswith("--base=") for a in session.posargs):
        session.error("nox -s ab needs -- --base REF (a git ref to compare against)")
    session.run("relax-harness", "ab", "--results", AB_RESULTS, *session.posargs, env=SINGLE_THREAD)


@nox.session(python=PYTHON)
def docker_scenarios(session: nox.Session) -> None:
    """Scenarios in real containers: starts a private dockerd (root, none running), builds images offline."""
    _install(session)
    state = os.environ.get("RELAX_DOCKERD_DIR", "/tmp/relax-dockerd")
    env_file = f"{state}/env"
    session.run("bash", "-c", f'mkdir -p {state} && containers/dockerd.sh start {state} > {env_file}', external=True)
    try:
        session.run("bash", "-c", f"set -a; . {env_file}; containers/build_images.sh cpu --offline", external=True)
        spec = SESSIONS["docker_scenarios"]
        args = " ".join(["tests/test_harness_docker.py", *spec.pytest_args(), *session.posargs])
        session.run("bash", "-c", f"set -a; . {env_file}; pytest {args}", external=True, env=SINGLE_THREAD)
        session.run("python", *spec.gate_args())
    finally:
        session.run("bash", "containers/dockerd.sh", "stop", state, external=True)


@nox.session(venv_backend="none")
def sglang_conformance(session: nox.Session) -> None:
    """Build the GPU image on this (CPU) machine and run the SGLang conformance tests inside it, against the
    real sglang package (tests/sglang/): starts a private dockerd (root), builds the offline base, then relax:gpu
    with packages from the registry. Prints the image's size and the sglang version. Not part of the default run."""
    state = os.environ.get("RELAX_DOCKERD_DIR", "/tmp/relax-dockerd")
    env_file = f"{state}/env"
    session.run("bash", "-c", f"mkdir -p {state} && containers/dockerd.sh start {state} > {env_file}", external=True)
    try:
        session.run("bash", "-c", f"set -a; . {env_file}; time containers/build_images.sh gpu --offline", external=True)
        session.run("bash", "-c", f"set -a; . {env_file}; docker image inspect relax:gpu --format "
                    "'relax:gpu {{.Size}} bytes'", external=True)
        session.run("bash", "-c", f"set -a; . {env_file}; docker run --rm --network host relax:gpu "
                    "python -m pytest -p no:cacheprovider -m sglang tests/sglang -q", external=True)
    finally:
        session.run("bash", "containers/dockerd.sh", "stop", state, external=True)


BENCHES = {"engine": "ci/bench_engine.py", "megatron": "ci/bench_megatron.py", "grpo": "ci/bench_grpo_e2e.py"}


def bench_commands(posargs: list[str]) -> list[list[str]]:
    """``[]``: every bench with its defaults; ``[NAME, ARGS...]``: that bench with ARGS; other
    arguments go to the engine bench (as before the other benches existed), then the other benches."""
    if posargs and posargs[0] in BENCHES:
        return [["python3", BENCHES[posargs[0]], *posargs[1:]]]
    rest = [["python3", path] for name, path in BENCHES.items() if name != "engine"]
    return [["python3", BENCHES["engine"], *posargs], *rest]


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """GPU benchmarks (run on the GPU machine), one table each: ci/bench_engine.py (embedded engine vs HF
    generate, bf16 log-prob mismatch), ci/bench_megatron.py (Megatron train MFU, colocate weight-sync
    s/GB) and ci/bench_grpo_e2e.py (GRPO step time of relax train vs TRL's GRPOTrainer, side by side).
    ``nox -s bench -- megatron --quick`` runs one bench with its arguments."""
    for command in bench_commands(list(session.posargs)):
        session.run(*command)
