"""The Ray cluster of a run: join the one the user names, or start a private one.

``--ray-address`` (or ``RAY_ADDRESS``, which ``ray job submit`` sets for its entrypoint) names a
running cluster: ``HOST:PORT`` of its head (``ray start --head --port PORT``) or ``auto`` for the
cluster ``ray start`` runs on this machine. Without one, the run starts a private single-node
cluster of its own (``RELAX_RAY_TEMP_DIR`` places its files) and it ends with the run.

Every actor gets the worker environment (one thread, offline, the ``RELAX_*`` fault hooks) through
its own ``runtime_env`` (relax/distributed/placement.py), so it reaches actors on every node even
inside a ``ray job submit`` job, whose runtime env a driver's ``ray.init(runtime_env=...)`` cannot
extend without conflicts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from relax.utils.flag_types import ConfigError

ADDRESS_ENV = "RAY_ADDRESS"


# NCCL's cuMem allocations (on by default since NCCL 2.19) should be on or off alike in the processes of a communicator
# that crosses GPUs of one host. SGLang 0.5.14 turns them off in its servers unless the variable is set, and the first
# weight broadcast from a trainer left at torch's default to such a server (H200 x4, trainer GPU 0, server GPU 1)
# failed with "unhandled cuda error ... Cuda failure 'invalid argument'", the symptom reported for peers that
# disagree. So every process relax starts, and the SGLang servers it launches, take SGLang's value; a user's own
# NCCL_CUMEM_ENABLE wins everywhere.
NCCL_CUMEM_ENABLE = "NCCL_CUMEM_ENABLE"


def nccl_cumem_env() -> dict[str, str]:
    return {NCCL_CUMEM_ENABLE: os.environ.get(NCCL_CUMEM_ENABLE, "0")}


def worker_env() -> dict[str, str]:
    """Environment for every Ray worker: one thread, offline, NCCL's cuMem setting, fault hooks passed through."""
    env = {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **nccl_cumem_env(),
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith("RELAX_")})
    return env


def cluster_address(flag: str | None) -> str | None:
    """The cluster to join: ``--ray-address``, else ``RAY_ADDRESS``; None (or ``local``): a private one."""
    address = flag or os.environ.get(ADDRESS_ENV) or None
    if address == "local":
        return None
    if address and address.startswith("ray://"):
        raise ConfigError(f"not supported yet: --ray-address {address} (Ray Client); give the head's HOST:PORT "
                          "(its GCS address) or submit the run with ray job submit")
    return address


def start_ray(use_gpu: bool, address: str | None) -> None:
    """Join the cluster at ``address``, or start a private local one when it is None."""
    import ray

    if ray.is_initialized():
        return
    for key, value in worker_env().items():
        os.environ.setdefault(key, value)
    quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address is not None:
        _send_token_if_asked(address)
        try:
            with _keeping_sigterm():
                ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise _join_error(address, exc) from None
        from relax.metrics import console

        gpus = node_gpus()
        console.info(f"joined the Ray cluster at {address}: {len(gpus)} node(s), {sum(gpus.values()):g} GPU(s)")
        return
    kwargs: dict = {"num_cpus": max(2, os.cpu_count() or 2), "include_dashboard": False,
                    "runtime_env": {"env_vars": worker_env()}, **quiet}
    temp_dir = os.environ.get("RELAX_RAY_TEMP_DIR")
    if temp_dir:
        kwargs["_temp_dir"] = temp_dir
    if not use_gpu:
        kwargs["num_gpus"] = 0
    with _keeping_sigterm():
        ray.init(address="local", **kwargs)


@contextlib.contextmanager
def _keeping_sigterm():
    """ray.init installs its own SIGTERM handler in the driver (``sys.exit(15)``); the run's own one
    (relax/utils/interrupts.py: record the end, then shut down) is put back."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread() and before is not None:
            signal.signal(signal.SIGTERM, before)


PROBE_TIMEOUT_S = 5.0
"""How long the token probe waits for the cluster's GCS (an unreachable one is ray.init's to report)."""


def _send_token_if_asked(address: str) -> None:
    """Turn token authentication on for this driver when the cluster asks for it and a token is where Ray keeps
    it (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``); one line at once when none is.

    Ray 2.60's ``ray start --head`` enables token auth whenever that token exists, but a driver given an
    explicit address sends it only under ``RAY_AUTH_MODE=token``, and without it ray.init retries for about
    30 s before it fails. Turning token mode on for a cluster without auth would lose the driver's actors, so
    the cluster is asked first: one unauthenticated call to its GCS, answered UNAUTHENTICATED when it wants
    a token. ``RAY_AUTH_MODE=token`` set by the user is left as it is."""
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if mode == "token" or not _cluster_wants_token(address):
        return
    from ray._private.authentication.authentication_token_setup import _enable_token_auth
    from ray._raylet import AuthenticationTokenLoader

    where = f"cannot join the Ray cluster at {address} (--ray-address / {ADDRESS_ENV}): it requires token authentication"
    if mode:
        raise ConfigError(f"{where}, and RAY_AUTH_MODE={mode} here; unset it or set RAY_AUTH_MODE=token")
    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        raise ConfigError(f"{where} and this machine has no token: put the cluster's token in ~/.ray/auth_token "
                          "or RAY_AUTH_TOKEN")
    _enable_token_auth()  # RAY_AUTH_MODE=token for this process (and what it starts), Ray's config refreshed


def _cluster_wants_token(address: str) -> bool:
    """True when the cluster's GCS refuses an unauthenticated call (False: it answers, or cannot be asked;
    an unreachable cluster is ray.init's to report)."""
    try:
        import grpc
        from ray._private.services import canonicalize_bootstrap_address
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # a Ray without token authentication
        return False
    try:
        target = canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - a bad address is ray.init's to report
        return False
    if target is None:
        return False
    with grpc.insecure_channel(target) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.UNAUTHENTICATED
    return False


def _join_error(address: str, exc: BaseException) -> ConfigError:
    """One line for a failed join. Token authentication is the usual surprise: Ray 2.60's ``ray start --head``
    turns it on when ``~/.ray/auth_token`` exists, while a driver (or ``ray start --address``) given an
    explicit address only sends the token under ``RAY_AUTH_MODE=token``."""
    chain = f"{exc} {exc.__cause__ or ''}"
    if "InvalidAuthToken" in chain or "Authentication" in chain:
        return ConfigError(f"cannot join the Ray cluster at {address} (--ray-address / {ADDRESS_ENV}): it requires "
                           "token authentication and no matching token was found; put the cluster's token in "
                           "~/.ray/auth_token or RAY_AUTH_TOKEN")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ConfigError(f"cannot join the Ray cluster at {address} (--ray-address / {ADDRESS_ENV}): {first}")


def node_gpus() -> dict[str, float]:
    """Alive node id -> its GPUs (0 for a node without any)."""
    import ray

    return {n["NodeID"]: float(n.get("Resources", {}).get("GPU", 0.0)) for n in ray.nodes() if n.get("Alive")}


def free_gpus() -> float:
    import ray

    return float(ray.available_resources().get("GPU", 0.0))
