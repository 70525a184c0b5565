"""When a gloo process group connects its members: inside its constructor (eager, gloo's default) or at its
first collective, through the group's store (lazy, how NCCL always works).

PyTorch reads ``TORCH_GLOO_LAZY_INIT`` when it constructs each gloo group, so the choice is made per group:

* the trainer group connects lazily (relax/distributed/trainer_group.py): a CPU run then depends on the
  driver's rendezvous store after start-up exactly as a GPU run's NCCL communicators do, so CPU tests catch
  a store that goes away (it broke every two-GPU run once, unseen on CPU);
* a weight-update group connects eagerly on CPU (relax/weights/update_group.py): a lazy gloo connection to a
  member that has died waits without a bound, while an eager one fails the next broadcast at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

ENV = "TORCH_GLOO_LAZY_INIT"


@contextlib.contextmanager
def gloo_connects(*, lazily: bool) -> Iterator[None]:
    """Gloo groups constructed inside connect lazily (or eagerly); the process's setting is restored after."""
    before = os.environ.get(ENV)
    os.environ[ENV] = "1" if lazily else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
