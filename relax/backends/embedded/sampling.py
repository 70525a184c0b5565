"""Per-request token sampling with its own seeded generator.

Log-prob convention (shared with the trainer): ``log_softmax(logits / temperature)`` of the
chosen token in fp32, *before* top-p/top-k filtering; temperature 0 is greedy and reports
the raw log-softmax. Each request draws from its own ``torch.Generator`` so the same seed and
request give the same tokens whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    skip_special_tokens: bool = False

    KNOWN = ("temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "seed",
             "skip_special_tokens")

    @classmethod
    def from_dict(cls, d: dict | None) -> SamplingParams:
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.KNOWN))
        if unknown:
            raise ValueError(f"unknown sampling_params field(s): {', '.join(unknown)}")
        clean = {k: v for k, v in d.items() if v is not None}
        if isinstance(clean.get("stop"), str):
            clean["stop"] = [clean["stop"]]
        for key in ("stop", "stop_token_ids"):
            if key in clean:
                clean[key] = tuple(clean[key])
        params = cls(**clean)
        if params.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {params.max_new_tokens}")
        if params.temperature < 0 or not 0 < params.top_p <= 1:
            raise ValueError(f"invalid temperature/top_p: {params.temperature}/{params.top_p}")
        return params


def filter_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) everything outside top-k and the top-p nucleus of a 1-D logit row."""
    out = scaled
    if 0 < top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        remove = cum - torch.softmax(sorted_logits, -1) >= top_p  # keep the token that crosses top_p
        out = out.clone()
        out[order[remove]] = float("-inf")
    return out


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    logits = logits.float()
    if params.temperature == 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, -1)[token])
    scaled = logits / params.temperature
    log_probs = torch.log_softmax(scaled, -1)
    probs = torch.softmax(filter_logits(scaled, params.top_k, params.top_p), -1)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(log_probs[token])
