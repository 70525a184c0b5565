"""Developer and CI sessions. `nox -s demo` and `nox -s tests` are the README's two commands.

CPU sessions install torch from the CPU wheel first (`torch==2.13.0`), so pip never resolves
a multi-GB CUDA build; the package's own `torch>=2.4` requirement is then already met.
GPU sessions run in the machine's own Python (torch with CUDA is preinstalled there).
"""

from __future__ import annotations

import os
import sys

import nox

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
    """Unit and integration tests of relax/ and harness/ (CPU, 2 workers)."""
    _install(session)
    _pytest(session, "-n", "2", "tests", "-m", "not gpu and not multi_gpu", "--junitxml=harness-results/tests-junit.xml")


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


def _gate(session: nox.Session, results: str, python: str = "python") -> None:
    session.run(python, "-m", "ci.gate", f"{results}/results.json", "--baselines", "ci/baselines",
                "--summary", f"{results}/summary.md")


@nox.session(python=PYTHON)
def scenarios(session: nox.Session) -> None:
    """CPU variants of every scenario family (local executor), then the regression gate."""
    _install(session)
    results = "harness-results/cpu"
    _pytest(session, "scenarios", "-n", "2", "--harness-profile", "cpu", "--harness-results", results,
            f"--junitxml={results}/junit.xml")
    _gate(session, results)


@nox.session(venv_backend="none")
def gpu_scenarios(session: nox.Session) -> None:
    """GPU variants in this machine's own Python (CUDA torch preinstalled; ray etc. via ci/wheelhouse)."""
    results = "harness-results/gpu"
    executor = "docker" if os.environ.get("RELAX_HARNESS_DOCKER_GPU") else "local"
    _pytest(session, "scenarios", "-m", "gpu", "--harness-profile", "gpu", "--harness-executor", executor,
            "--harness-results", results, f"--junitxml={results}/junit.xml")
    _gate(session, results, python=sys.executable)


@nox.session(python=PYTHON)
def docker_scenarios(session: nox.Session) -> None:
    """Scenarios in real containers: starts a private dockerd (root, none running), builds images offline."""
    _install(session)
    state = os.environ.get("RELAX_DOCKERD_DIR", "/tmp/relax-dockerd")
    env_file = f"{state}/env"
    session.run("bash", "-c", f'mkdir -p {state} && containers/dockerd.sh start {state} > {env_file}', external=True)
    try:
        session.run("bash", "-c", f"set -a; . {env_file}; containers/build_images.sh cpu --offline", external=True)
        session.run("bash", "-c", f"set -a; . {env_file}; pytest tests/test_harness_docker.py scenarios "
                    "--harness-executor docker --harness-profile cpu --harness-results harness-results/docker",
                    external=True, env=SINGLE_THREAD)
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
