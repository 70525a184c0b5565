"""The embedded rollout engine: batched decoding over an HF causal LM with a KV cache.

Requests and responses are SGLang-shaped dicts (``input_ids`` + ``sampling_params`` in,
``output_ids`` + ``meta_info.output_token_logprobs`` + ``finish_reason`` out), so the same
rollout code drives this engine and a real SGLang server.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

from relax.backends.embedded.sampling import SamplingParams, sample_token
from relax.weights.checksum import state_checksums


@dataclass
class _Request:
    input_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    max_new: int
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    text: str = ""


class EmbeddedEngine:
    def __init__(self, model: torch.nn.Module, *, eos_token_ids: list[int], device: str = "cpu",
                 max_context_len: int | None = None, tokenizer: Any = None):
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.eos_token_ids = set(eos_token_ids)
        self.tokenizer = tokenizer
        self.max_context_len = max_context_len or int(getattr(model.config, "max_position_embeddings", 4096))
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        self.weight_version = 0
        self._seed_counter = itertools.count(1)

    # ------------------------------------------------------------------ requests
    def _make_request(self, req: dict) -> _Request:
        input_ids = list(req["input_ids"])
        if not input_ids:
            raise ValueError("empty input_ids")
        params = SamplingParams.from_dict(req.get("sampling_params"))
        if len(input_ids) >= self.max_context_len:
            raise ValueError(f"prompt of {len(input_ids)} tokens does not fit the context of {self.max_context_len}")
        seed = params.seed if params.seed is not None else next(self._seed_counter)
        gen = torch.Generator().manual_seed(int(seed))
        max_new = min(params.max_new_tokens, self.max_context_len - len(input_ids))
        return _Request(input_ids, params, gen, max_new)

    def _check_finish(self, r: _Request, token: int) -> None:
        if token in self.eos_token_ids or token in r.params.stop_token_ids:
            r.finish = {"type": "stop", "matched": token}
        elif r.params.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(r.output_ids)
            for stop in r.params.stop:
                if stop in text:
                    r.finish = {"type": "stop", "matched": stop}
                    r.text = text[: text.index(stop)]
                    return
        if r.finish is None and len(r.output_ids) >= r.max_new:
            r.finish = {"type": "length", "length": len(r.output_ids)}

    def _response(self, r: _Request) -> dict:
        if not r.text and self.tokenizer is not None:
            r.text = self.tokenizer.decode(r.output_ids, skip_special_tokens=r.params.skip_special_tokens)
        return {
            "text": r.text,
            "output_ids": r.output_ids,
            "meta_info": {
                "output_token_logprobs": [[lp, tok, None] for lp, tok in zip(r.logprobs, r.output_ids, strict=True)],
                "finish_reason": r.finish,
                "prompt_tokens": len(r.input_ids),
                "completion_tokens": len(r.output_ids),
                "weight_version": self.weight_version,
            },
        }

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def generate(self, requests: list[dict]) -> list[dict]:
        reqs = [self._make_request(r) for r in requests]
        if not reqs:
            return []
        width = max(len(r.input_ids) for r in reqs)
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(reqs), width), dtype=torch.long)
        for i, r in enumerate(reqs):  # left padding: the next token of every row is at the end
            ids[i, width - len(r.input_ids):] = torch.tensor(r.input_ids)
            mask[i, width - len(r.input_ids):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        past = None
        step_ids = ids
        while True:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
            out = self.model(input_ids=step_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :]
            next_ids = torch.full((len(reqs),), self.pad_id, dtype=torch.long)
            for i, r in enumerate(reqs):
                if r.finish is not None:
                    continue
                token, logprob = sample_token(logits[i], r.params, r.generator)
                r.output_ids.append(token)
                r.logprobs.append(logprob)
                next_ids[i] = token
                self._check_finish(r, token)
            if all(r.finish is not None for r in reqs):
                break
            step_ids = next_ids.to(self.device).unsqueeze(-1)
            alive = torch.tensor([r.finish is None for r in reqs], dtype=torch.long, device=self.device)
            mask = torch.cat([mask, alive.unsqueeze(-1)], dim=-1)
        return [self._response(r) for r in reqs]

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def update_weights_from_tensors(self, named_tensors, version: int | None = None) -> None:
        state = self.model.state_dict()
        items = named_tensors.items() if isinstance(named_tensors, dict) else named_tensors
        for name, tensor in items:
            if name not in state:
                raise ValueError(f"unknown weight {name!r}")
            state[name].copy_(tensor.to(state[name].device, state[name].dtype))
        self.weight_version = self.weight_version + 1 if version is None else int(version)

    def weight_checksums(self) -> dict[str, str]:
        return state_checksums(self.model.state_dict().items())
