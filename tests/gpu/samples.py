"""Train samples for the GPU backend tests: 8 samples of varied prompt/response lengths, rewards 0/1."""

from __future__ import annotations

import torch


def varied_samples(seed: int) -> list:
    from relax.backends.torch.batch import TrainSample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(8):
        prompt, resp = 8 + 4 * (i % 4), 6 + 5 * (i % 3)
        tokens = torch.randint(3, 100, (prompt + resp,), generator=g).tolist()
        out.append(TrainSample(tokens=tokens, response_length=resp, loss_mask=[1] * resp, reward=float(i % 2)))
    return out
