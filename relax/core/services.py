"""The fully-async services: ``reference``, ``actor_fwd`` and ``advantages`` roles of ``--resource``.

Why they exist: in fully-async mode the trainer is the pipeline's bottleneck (rollout runs
ahead of it), yet each step it spends two no-grad forward passes over the whole batch (old
log-probs with the policy, reference log-probs with a frozen copy) and holds that frozen copy
in memory. Seed 004 moves this work to separate lightweight services so the trainer's GPUs only
run optimizer steps; its 8-GPU split is actor 4, rollout 2, reference 1, actor_fwd 1 and
advantages 0 (CPU only), with ``--ref-actor-config`` giving the services their own parallelism
and token budget.

- ``reference``: the frozen reference model (the weights the trainer's reference copy would
  have: the initial ``--hf-checkpoint``); per-token reference log-probs.
- ``actor_fwd``: a copy of the policy that receives every weight sync like an engine (sides
  ``actor_fwd:<i>`` in weights.jsonl, one per replica), so when a step is handed to training it holds exactly the
  weights the trainer starts that step with; per-token old log-probs.
- ``advantages`` (CPU): `compute_advantages` from rewards, loss masks and the two columns.

The work of each role is relax/backends/services.py (`ForwardService`, `AdvantageService`); its Ray actor
relax/distributed/service_actors.py; the driver's handles `ServiceGroup` here.

Exactness: a forward service builds the trainer's own backend class through
`build_train_backend(..., service=role)` (``only_load_weight``: no optimizer, no grads)
and runs the trainer's log-prob code (`forward_log_probs`), so its columns equal the trainer's
own bit for bit unless ``max_tokens_per_gpu`` changes the micro-batch split (then to float
summation order). `ServiceGroup.precompute` chains the calls as Ray futures: the two forwards
run concurrently, advantages waits for both, and the trainer receives one `Precomputed`.

Samples arrive as a list of `TrainSample` or as an object whose ``fetch()`` returns that list
(the data queue's `StoredBatch`): each service fetches them itself, storage -> consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ray

from relax.backends.config import TrainerConfig
from relax.backends.torch.batch import Precomputed
from relax.distributed.placement import Placement
from relax.distributed.resources import SERVICE_ROLES
from relax.distributed.service_actors import AdvantagesActor, ForwardServiceActor
from relax.weights.transports import SyncTarget


@dataclass
class ServiceGroup:
    """The driver's handles on the service actors: each role's replicas (empty where the role is not configured).

    Replicas of a forward role share each batch: replica ``i`` of ``k`` computes the log-prob micro-batches
    ``i, i + k, ...`` of the trainer's own split (`relax.backends.services.ForwardService.log_probs`), so every
    row is computed exactly as one replica would; the parts are added (each entry is non-zero in one part only).
    The advantages of a batch are one computation (some estimators whiten over the whole batch): its replicas
    take whole batches in turn."""

    reference: list = field(default_factory=list)
    actor_fwd: list = field(default_factory=list)
    advantages: list = field(default_factory=list)
    batches: int = 0  # batches precomputed so far (which advantages replica takes the next)

    @classmethod
    def start(cls, cfg: TrainerConfig, device: str, placement: Placement) -> ServiceGroup:
        """Create the actors (they load their models concurrently with the trainer and engines); ``cfg``: the
        trainer's slice of the flags (the forward copies are the trainer's backend)."""
        handles: dict[str, list] = {}
        for role, slots in placement.services.items():
            if role == "advantages":
                handles[role] = [AdvantagesActor.options(**slot.options).remote(cfg) for slot in slots]
            else:  # a role given no GPU computes on CPU, even on a GPU run
                handles[role] = [ForwardServiceActor.options(**slot.options).remote(cfg, device if slot.gpus else "cpu",
                                                                                    role) for slot in slots]
        return cls(**handles)

    def actors(self) -> dict[str, object]:
        """``"<role>:<i>"`` -> handle, for events and shutdown."""
        return {f"{role}:{i}": handle for role in SERVICE_ROLES for i, handle in enumerate(getattr(self, role))}

    def sync_targets(self) -> list:
        """The weight-sync targets besides the engines: each actor_fwd replica's weight endpoints, under its own
        side name (``actor_fwd:<i>``)."""
        ends = ray.get([handle.endpoint.remote() for handle in self.actor_fwd])
        return [SyncTarget(f"actor_fwd:{i}", url, device) for i, (url, device) in enumerate(ends)]

    def precompute(self, payload) -> object:
        """Chain the services for one batch; returns what the trainer's ``precomputed`` argument gets
        (an ObjectRef of a `Precomputed` when the advantages service runs, which Ray resolves in the trainer)."""
        old_parts, ref_parts = _submit(self.actor_fwd, payload), _submit(self.reference, payload)  # both run at once
        old, ref = _combine(old_parts), _combine(ref_parts)
        if self.advantages:  # validation: advantages comes with actor_fwd (and reference when needed)
            replica = self.advantages[self.batches % len(self.advantages)]
            self.batches += 1
            return replica.compute.remote(payload, old, ref)
        return Precomputed(old_log_probs=None if old is None else ray.get(old),
                           ref_log_probs=None if ref is None else ray.get(ref))


def _submit(replicas: list, payload) -> list:
    """One forward role's calls for a batch: the whole batch to a lone replica, a share to each of several."""
    if len(replicas) == 1:
        return [replicas[0].log_probs.remote(payload)]
    return [r.log_probs.remote(payload, (i, len(replicas))) for i, r in enumerate(replicas)]


def _combine(parts: list) -> object:
    """The role's ``[N, T]`` log-probs as an ObjectRef (None without the role): the parts added."""
    if len(parts) <= 1:
        return parts[0] if parts else None
    tensors = ray.get(parts)
    return ray.put(sum(tensors[1:], tensors[0]))
