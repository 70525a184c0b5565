"""Plain-Python float64 references and fixtures for the tests of relax.algorithms.

Nothing here imports relax.algorithms: references are loops over lists, written from the
formulas in docs/algorithms.md, so a shared mistake cannot hide in shared code.
"""

from __future__ import annotations

import math
import random
from argparse import Namespace

import torch

from relax.utils.flag_table import FLAGS


def make_args(**overrides) -> Namespace:
    """A parsed-flags namespace: schema defaults, overrides, then the derived values validation resolves."""
    args = Namespace(**{f.dest: f.default for f in FLAGS})
    for key, value in overrides.items():
        assert hasattr(args, key), key
        setattr(args, key, value)
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.critic_lr is None:
        args.critic_lr = args.lr
    return args


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def random_mask(
    rng: random.Random, b: int, t_len: int, empty_rows: int = 1, holes: bool = False
) -> list[list[float]]:
    lengths = [rng.randint(1, t_len) for _ in range(b)]
    for i in rng.sample(range(b), empty_rows):
        lengths[i] = 0
    mask = [[1.0 if j < n else 0.0 for j in range(t_len)] for n in lengths]
    if holes:  # multi-turn style: tool tokens inside a response are not trained on
        for row in mask:
            for j in range(1, t_len - 1):
                if row[j] and rng.random() < 0.25:
                    row[j] = 0.0
    return mask


def random_matrix(rng: random.Random, b: int, t_len: int, lo: float, hi: float) -> list[list[float]]:
    return [[rng.uniform(lo, hi) for _ in range(t_len)] for _ in range(b)]


def near(rng: random.Random, m: list[list[float]], spread: float) -> list[list[float]]:
    return [[x + rng.uniform(-spread, spread) for x in row] for row in m]


def masked_rows(values, mask):
    """Per row: the list of values at valid tokens."""
    return [[v for v, k in zip(vr, mr, strict=True) if k] for vr, mr in zip(values, mask, strict=True)]


def reduce_ref(values, mask, per_token: bool, num_samples: int, num_tokens: int) -> float:
    rows = masked_rows(values, mask)
    if per_token:
        return sum(sum(r) for r in rows) / max(num_tokens, 1)
    return sum(sum(r) / len(r) for r in rows if r) / max(num_samples, 1)


def kl_ref(a: float, b: float, kind: str) -> float:
    d = a - b
    if kind == "k1":
        return d
    if kind == "k2":
        return d * d / 2
    k3 = math.exp(-d) - 1 + d
    return k3 if kind == "k3" else min(max(k3, -10.0), 10.0)


def group_norm_ref(rewards: list[float], group: int, std: bool) -> list[float]:
    out = []
    for g in range(0, len(rewards), group):
        chunk = rewards[g : g + group]
        mean = sum(chunk) / len(chunk)
        if all(r == chunk[0] for r in chunk):
            out += [0.0] * len(chunk)
            continue
        sd = math.sqrt(sum((r - mean) ** 2 for r in chunk) / max(len(chunk) - 1, 1))
        out += [(r - mean) / (sd + 1e-6) if std else r - mean for r in chunk]
    return out


def whiten_ref(values, mask):
    flat = [v for row in masked_rows(values, mask) for v in row]
    n = max(len(flat), 1)
    mean = sum(flat) / n
    var = sum((v - mean) ** 2 for v in flat) / n
    return [
        [(v - mean) / math.sqrt(var + 1e-8) if k else 0.0 for v, k in zip(vr, mr, strict=True)]
        for vr, mr in zip(values, mask, strict=True)
    ]
