"""The Ray actor that hosts one embedded engine, served over SGLang's HTTP API like any SGLang server.

Generation, weight updates, memory release and health all go over HTTP (the engine contract,
DESIGN.md); Ray only places the process, reports its pid and endpoint, and kills it. The server binds
loopback when the run lives on one machine, else this node's address with the run's API key.
"""

from __future__ import annotations

import os

import ray
import torch

from relax.backends.embedded.config import EmbeddedEngineConfig
from relax.utils.fault_hooks import engine_unhealthy
from relax.utils.gc_pauses import collections_paused, freeze_startup_objects
from relax.weights import checksum
from relax.weights.devices import device_identity


@ray.remote
class EngineActor:
    def __init__(self, cfg: EmbeddedEngineConfig, device: str, engine_id: int, host: str = "127.0.0.1",
                 api_key: str | None = None):
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        with collections_paused():  # the model classes' imports and the build (relax/utils/gc_pauses.py)
            from relax.backends.embedded.hosting import serve_in_thread
            from relax.backends.embedded.scheduler import Scheduler
            from relax.backends.embedded.server import EngineServer

            if host == "node":  # the cluster spans machines: serve on this node's address (with the run's API key)
                host = ray.util.get_node_ip_address()
            self.engine_id = engine_id
            self.engine = build_engine(cfg, device)
            checksum.warm_up(self.engine.device)
            self.server = EngineServer(Scheduler(self.engine), api_key=api_key, model_path=str(cfg.hf_checkpoint))
            self.server.never_generates = engine_unhealthy(engine_id)  # a planted fault; off unless the harness sets it
        self.url = serve_in_thread(self.server.app(), host, name=f"relax-engine-{engine_id}-http").url
        freeze_startup_objects()  # the model and the imports: full GCs skip them (relax/utils/gc_pauses.py)

    def pid(self) -> int:
        return os.getpid()

    def endpoint(self) -> tuple[str, str]:
        """(URL, `device_identity` of its weights)."""
        return self.url, device_identity(self.engine.device)

    def freeze_gc(self) -> int:
        """`freeze_startup_objects` again once the first steps have compiled and captured (relax/utils/gc_pauses.py)."""
        return freeze_startup_objects()

    def device_bytes(self) -> int:
        """CUDA memory this process holds (for the offload metrics: the caching allocator's and the lean runner's
        regions, `relax.backends.embedded.device_region`), 0 on CPU."""
        from relax.backends.embedded.device_region import held_bytes

        return held_bytes(self.engine.device)


def build_engine(cfg: EmbeddedEngineConfig, device: str):
    """The embedded engine an `EngineActor` hosts: ``--hf-checkpoint`` in the trainer's export dtype, with
    the runner ``--embedded-runner`` / ``--embedded-cuda-graph`` / ``--embedded-compile`` resolve to on
    ``device`` (relax/backends/embedded/runner_choice.py)."""
    from relax.backends.embedded.engine import EmbeddedEngine
    from relax.backends.embedded.runner_choice import engine_runner_kwargs
    from relax.backends.train_registry import weight_dtype
    from relax.models import build_model, load_tokenizer

    tokenizer = load_tokenizer(cfg.hf_checkpoint)
    # the engine holds weights in the trainer's export dtype, so both sides' checksums agree bitwise
    dtype = weight_dtype(cfg.train_backend, cfg.bf16)
    model = build_model(cfg.hf_checkpoint, dtype=dtype, seed=cfg.seed).to(device).eval()
    eos = [t for t in [tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None)] if isinstance(t, int)]
    return EmbeddedEngine(model, eos_token_ids=sorted(set(eos)), device=device,
                          max_context_len=cfg.rollout_max_context_len, tokenizer=tokenizer,
                          train_identical_logprobs=cfg.true_on_policy_mode, audio_sample_rate=cfg.sample_rate,
                          **engine_runner_kwargs(cfg, device, model))
