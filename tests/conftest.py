"""Every test process connects gloo groups lazily, at their first collective, as NCCL does on GPUs.

Gloo connects eagerly by default, inside the group's constructor, while every member is still there; NCCL
connects at the first collective, through the group's store. A store that went away after start-up broke
every two-GPU run and no CPU test saw it. Ray workers get the same setting from relax's worker environment
(relax/distributed/cluster.py).
"""

import os

os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
