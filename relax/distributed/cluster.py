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

import logging
import os

from relax.utils.flag_types import ConfigError

ADDRESS_ENV = "RAY_ADDRESS"


def worker_env() -> dict[str, str]:
    """Environment for every Ray worker: one thread, offline, lazy gloo, fault hooks passed through."""
    env = {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # gloo (CPU runs) opens its connections at a group's first collective, through the group's store, as
        # NCCL does on GPUs: a CPU run takes the GPU run's rendezvous path (a store that must outlive start-up)
        "TORCH_GLOO_LAZY_INIT": os.environ.get("TORCH_GLOO_LAZY_INIT", "1"),
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
        try:
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
    ray.init(address="local", **kwargs)


def _join_error(address: str, exc: BaseException) -> ConfigError:
    """One line for a failed join. Token authentication is the usual surprise: Ray 2.60's ``ray start --head``
    turns it on when ``~/.ray/auth_token`` exists, while a driver (or ``ray start --address``) given an
    explicit address only sends the token under ``RAY_AUTH_MODE=token``."""
    chain = f"{exc} {exc.__cause__ or ''}"
    if "InvalidAuthToken" in chain or "Authentication" in chain:
        return ConfigError(f"cannot join the Ray cluster at {address} (--ray-address / {ADDRESS_ENV}): it requires "
                           "token authentication; export RAY_AUTH_MODE=token with the cluster's token in "
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
