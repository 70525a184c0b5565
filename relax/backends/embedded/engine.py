"""The embedded rollout engine: batched decoding over an HF causal LM with a KV cache.

Requests and responses are SGLang-shaped dicts (``input_ids`` + ``sampling_params`` in,
``output_ids`` + ``meta_info.output_token_logprobs`` + ``finish_reason`` out), so the same
rollout code drives this engine and a real SGLang server.

The engine is a step machine so a scheduler can run continuous batching on top of it:
``add_request`` queues work, each ``step`` admits waiting requests (prefill into the running
batch) and decodes one token for every running request, and finished requests leave the batch
at once. ``generate`` is the synchronous wrapper: add everything, step until done.

The KV cache and forwards belong to a runner: ``"hf"`` (default; HF DynamicCache, left
padding), ``"static"`` (preallocated slots over HF's decoder layers) or ``"lean"`` (our own
decoder forward over the model's weights, batched prefill, decode and sampling captured as CUDA
graphs with ``cuda_graph=True``; the fast GPU path). The per-row decode state (the *pending*
token — sampled, not yet in the cache — sampling parameters, random-stream counter) lives in
device buffers (`RowState`) so sampling needs one host synchronization per step.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from relax.backends.embedded import routed_experts
from relax.backends.embedded.detokenize import Detokenizer
from relax.backends.embedded.image_data import parse_media
from relax.backends.embedded.lean_runner import LeanRunner
from relax.backends.embedded.rows import Fetch, RowState
from relax.backends.embedded.runners import HFRunner, StaticRunner
from relax.backends.embedded.sampling import SamplingParams
from relax.backends.embedded.vision_runner import VisionRunner
from relax.engine.protocol import GENERATE_REQ, MEMORY_TAGS, check_fields, weight_version_str
from relax.models.checkpoint_names import checkpoint_state, moe_style
from relax.models.vision import is_vision_config
from relax.utils.fault_hooks import EngineHooks
from relax.weights.checksum import state_checksums

# The top-level /generate fields this engine implements (relax.engine.protocol.GENERATE_REQ has all of SGLang's);
# the others are accepted only at SGLang's default. log_metrics: no per-request metrics are logged either way.
IMPLEMENTED_REQUEST_FIELDS = frozenset({"input_ids", "text", "sampling_params", "return_logprob", "logprob_start_len",
                                        "rid", "return_text_in_logprobs", "log_metrics", "top_logprobs_num",
                                        "return_prompt_token_ids", "return_routed_experts",
                                        "routed_experts_start_len", "image_data", "video_data",
                                        "audio_data", "use_audio_in_video"})


@dataclass
class Request:
    """One generation request moving through the engine."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    seed: int
    max_new: int
    return_logprob: bool
    logprob_start_len: int = -1  # >= 0: also return prompt log-probs from this position (SGLang's field)
    logprob_text: bool = False  # return_text_in_logprobs: each log-prob entry carries its token's text
    prompt_ids_out: bool = False  # return_prompt_token_ids: the answer carries prompt_token_ids (SGLang 0.5.14)
    input_logprobs: list[float | None] | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    routed: list[torch.Tensor] | None = None  # return_routed_experts: routing rows so far (routed_experts.py)
    routed_start: int = 0  # routed_experts_start_len
    media: dict[str, Any] | None = None  # image_data / video_data / audio_data as model inputs (image_data.py)
    rescored: bool = False  # logprobs replaced by the train-identical computation (--true-on-policy-mode)
    finish: dict[str, Any] | None = None
    text: str | None = None
    created: float = field(default_factory=time.monotonic)

    @property
    def done(self) -> bool:
        return self.finish is not None


class EmbeddedEngine:
    """HF causal LM + KV-cache batching + per-request seeded sampling + weight updates."""

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: Iterable[int], device: str = "cpu",
                 max_context_len: int | None = None, tokenizer: Any = None, max_running_requests: int = 256,
                 runner: str = "hf", cuda_graph: bool = False, compile: bool = False,
                 compile_mode: str | None = None, overlap: bool | None = None, weights_cpu_backup: bool = False,
                 train_identical_logprobs: bool = False, audio_sample_rate: int = 16000):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.tokenizer = tokenizer
        self.detokenizer = Detokenizer(tokenizer) if tokenizer is not None else None
        limit = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 1 << 30)
        self.max_context_len = min(int(max_context_len), limit) if max_context_len else limit
        self.max_running_requests = max_running_requests
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        self._weight_version = 0
        self._seed_counter = itertools.count(1)
        self._rid_counter = itertools.count()
        self.waiting: list[Request] = []
        self.reqs: list[Request] = []  # running rows, in the runner's row order
        self.state = RowState(max_running_requests, self.device)
        # Overlap (default on CUDA): launch decode step t+1 before reading step t's tokens, so the
        # host's per-request work hides behind the GPU. A request that finished at step t gets
        # one wasted token in step t+1, which is discarded.
        self.overlap = self.device.type == "cuda" if overlap is None else bool(overlap)
        self._inflight: list[tuple[list[Request], Fetch]] = []
        self.vision_config = model.config if is_vision_config(model.config) else None
        self.audio_sample_rate = int(audio_sample_rate)  # audio_data is resampled to it (--audio-sample-rate)
        if self.vision_config is not None and runner != "hf":
            raise ValueError(f"not supported yet: the {runner} runner with a vision-language model (use hf)")
        if runner == "hf":
            runner_cls = VisionRunner if self.vision_config is not None else HFRunner
            self.runner: HFRunner | StaticRunner | LeanRunner = runner_cls(self.model, self.device, self.pad_id)
        elif runner == "static":
            self.runner = StaticRunner(self.model, self.device, slots=max_running_requests,
                                       max_len=self.max_context_len, cuda_graph=cuda_graph)
        elif runner == "lean":
            self.runner = LeanRunner(self.model, self.device, slots=max_running_requests,
                                     max_len=self.max_context_len, cuda_graph=cuda_graph, compile=compile,
                                     compile_mode=compile_mode)
        else:
            raise ValueError(f"unknown runner {runner!r} (hf, static or lean)")
        self.released_tags: set[str] = set()  # SGLang's memory tags released (relax.engine.protocol.MEMORY_TAGS)
        # SGLang's --enable-weights-cpu-backup: a release keeps the weights' values (pinned host copies, reused by
        # every release); without it (SGLang's default) a release discards them and a weight sync restores them
        self.weights_cpu_backup = bool(weights_cpu_backup)
        self._parking: list[torch.Tensor] = []
        self._discarded: list[tuple[str, torch.nn.Parameter, torch.Size]] = []  # released without a backup
        self._unwritten: dict[int, str] = {}  # id(parameter) -> name: re-allocated at resume, not yet written
        self._spans: list[tuple[int, int, int]] = []  # (first, end address, id) of each re-allocated parameter
        self._pieces: dict[int, set[tuple[int, int]]] = {}  # id(parameter) -> (address, numel) of unwritten views
        # --true-on-policy-mode: a finished request's log-probs come from the trainer's computation (train_identical.py)
        self.train_identical_logprobs = bool(train_identical_logprobs)
        self.hooks = EngineHooks.from_env()  # the harness's planted defects (relax/utils/fault_hooks.py); off by default

    # ------------------------------------------------------------------ properties
    @property
    def weight_version(self) -> int:
        return self._weight_version

    @weight_version.setter
    def weight_version(self, value: int) -> None:
        self._weight_version = int(value)

    @property
    def running(self) -> list[Request]:
        return self.reqs

    def has_work(self) -> bool:
        return bool(self.waiting or self.reqs)

    def named_parameters(self, *args, **kwargs):
        return self.model.named_parameters(*args, **kwargs)

    # ------------------------------------------------------------------ requests
    def make_request(self, req: dict[str, Any]) -> Request:
        """Validate one SGLang-shaped request dict; raises ``ValueError`` with a one-line message."""
        if not isinstance(req, dict):
            raise ValueError(f"a request must be an object, got {type(req).__name__}")
        check_fields(req, GENERATE_REQ, IMPLEMENTED_REQUEST_FIELDS, "generate")
        if req.get("top_logprobs_num") not in (None, 0):  # SGLang's None means 0: no top log-probs
            raise ValueError(f"generate: top_logprobs_num={req['top_logprobs_num']!r} is not implemented by this "
                             "engine (only 0)")
        # media first: a prompt with one <|image_pad|> per image (SGLang's form) grows to its expanded length here
        media, input_ids = parse_media(req, self._input_ids(req), self.vision_config, self.audio_sample_rate)
        params = SamplingParams.from_dict(req.get("sampling_params"))
        if params.stop and self.tokenizer is None:
            raise ValueError("sampling_params.stop needs a tokenizer; use stop_token_ids")
        if len(input_ids) >= self.max_context_len:
            raise ValueError(f"prompt of {len(input_ids)} tokens does not fit the context length "
                             f"{self.max_context_len}")
        seed = params.sampling_seed if params.sampling_seed is not None else next(self._seed_counter)
        max_new = min(params.max_new_tokens, self.max_context_len - len(input_ids))
        rid = req.get("rid")
        rid = str(rid) if rid is not None else f"req-{next(self._rid_counter)}"
        return_logprob = bool(req.get("return_logprob", False))
        start = _logprob_start_len(req.get("logprob_start_len"), len(input_ids)) if return_logprob else -1
        if params.max_new_tokens == 0 and start < 0:
            raise ValueError("sampling_params.max_new_tokens must be > 0 (0 only scores the prompt: "
                             "return_logprob with logprob_start_len >= 0)")
        if media is not None and (start >= 0 or self.train_identical_logprobs):
            raise ValueError("generate: prompt log-probs (logprob_start_len >= 0) and --true-on-policy-mode are not "
                             "implemented for requests with image_data, video_data or audio_data")
        routed = bool(req.get("return_routed_experts", False))
        if routed:
            routed_experts.check_model(self.model, bool(getattr(self.runner, "cuda_graph", False)))
        return Request(rid, input_ids, params, int(seed) & ((1 << 63) - 1), max_new, return_logprob, start,
                       logprob_text=bool(req.get("return_text_in_logprobs", False)),
                       prompt_ids_out=bool(req.get("return_prompt_token_ids", False)),
                       routed=[] if routed else None,
                       routed_start=routed_experts.start_len(req, len(input_ids)) if routed else 0, media=media)

    def _input_ids(self, req: dict[str, Any]) -> list[int]:
        ids = req.get("input_ids")
        if ids is None and isinstance(req.get("text"), str):
            if self.tokenizer is None:
                raise ValueError("text input needs a tokenizer; send input_ids")
            ids = self.tokenizer.encode(req["text"], add_special_tokens=False)
        if not isinstance(ids, list) or not ids:
            raise ValueError("input_ids must be a non-empty list of token ids")
        vocab = int(self.model.config.get_text_config().vocab_size)
        # type() and min/max run in C: a batch of 64 x 128 ids per rollout is checked in ~0.1 ms (bools and
        # numpy integers are refused, as JSON never sends them)
        if set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"input_ids must be integers in [0, {vocab})")
        return list(ids)

    def add_request(self, req: dict[str, Any] | Request) -> Request:
        if self.released:
            raise RuntimeError("engine memory is released; call resume_memory_occupation first")
        if self._unwritten:
            raise RuntimeError(self._unwritten_message())
        r = req if isinstance(req, Request) else self.make_request(req)
        self.waiting.append(r)
        return r

    def abort(self, rid: str | None = None, *, abort_all: bool = False, message: str | None = None) -> list[Request]:
        """Finish matching waiting/running requests with ``finish_reason.type == "abort"``.

        Running requests keep the tokens and log-probs generated so far; they leave the batch
        now, so a caller holding them gets a partial response it can resume from.
        """
        hit = [r for r in [*self.waiting, *self.reqs] if abort_all or r.rid == rid]
        for r in hit:
            # SGLang's FINISH_ABORT.to_json: status_code and err_type are None for an abort by request
            r.finish = {"type": "abort", "message": message or "aborted by request", "status_code": None,
                        "err_type": None}
        self.waiting = [r for r in self.waiting if not r.done]
        self._drop_finished()
        return hit

    def response(self, r: Request) -> dict[str, Any]:
        if r.text is None:
            r.text = self._decode(r.output_ids, r.params.skip_special_tokens)
        meta: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": r.finish,
            "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(r.output_ids),
            "reasoning_tokens": 0,
            "cached_tokens": 0,
            "num_retractions": 0,  # SGLang 0.5.14's name (0.5.10: total_retractions); this engine never retracts
            "weight_version": weight_version_str(self._weight_version),  # a string, as SGLang's
            "e2e_latency": time.monotonic() - r.created,
        }
        if r.return_logprob:
            if self.train_identical_logprobs and not r.rescored:
                r.logprobs, r.rescored = self._train_identical(r), True
            meta["output_token_logprobs"] = self._logprob_entries(r.logprobs, r.output_ids, r.logprob_text)
            meta["output_token_logprobs_length"] = len(r.output_ids)
            meta["input_token_logprobs"] = []  # SGLang: logprob_start_len -1 starts at the prompt's end
        if r.input_logprobs is not None:
            tail = r.input_ids[r.logprob_start_len:]
            meta["input_token_logprobs"] = self._logprob_entries(r.input_logprobs, tail, r.logprob_text)
        out = {"text": r.text, "output_ids": list(r.output_ids), "meta_info": meta}
        if r.routed is not None:
            meta["routed_experts"] = routed_experts.meta_value(r)
        if r.prompt_ids_out:
            out["prompt_token_ids"] = list(r.input_ids)
        return out

    def _train_identical(self, r: Request) -> list[float]:
        from relax.backends.embedded.train_identical import train_identical_logprobs

        return train_identical_logprobs(self.model, [*r.input_ids, *r.output_ids], len(r.output_ids),
                                        temperature=r.params.temperature, pad_id=self.pad_id, device=self.device)

    def _logprob_entries(self, logprobs: list, ids: list[int], with_text: bool) -> list[list]:
        """SGLang's ``[logprob, token_id, text]`` triples; text only with ``return_text_in_logprobs``."""
        texts = ([self._decode([t], False) for t in ids] if with_text and self.tokenizer is not None
                 else [None] * len(ids))
        return [[lp, tok, text] for lp, tok, text in zip(logprobs, ids, texts, strict=True)]

    def responses(self, reqs: list[Request]) -> list[dict[str, Any]]:
        """`response` of each request, the texts still missing decoded together (on threads: detokenize.py)."""
        todo = [r for r in reqs if r.text is None]
        if todo and self.detokenizer is not None:
            texts = self.detokenizer.decode_many([r.output_ids for r in todo],
                                                 [r.params.skip_special_tokens for r in todo])
            for r, text in zip(todo, texts, strict=True):
                r.text = text
        return [self.response(r) for r in reqs]

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if self.detokenizer is None:
            return ""
        return self.detokenizer.decode(ids, skip_special_tokens)

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def generate(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run ``requests`` to completion (alongside anything already queued) and return responses."""
        reqs = [self.make_request(r) for r in requests]  # validate all before queueing any
        for r in reqs:
            self.add_request(r)
        while not all(r.done for r in reqs):
            self.step()
        return self.responses(reqs)

    @torch.no_grad()
    def step(self) -> list[Request]:
        """Admit waiting requests, decode one token for the batch; return the requests that finished.

        In overlap mode the tokens of a decode step are applied during the next ``step`` call
        (after launching the following decode), so requests finish one call later.
        """
        started = time.perf_counter()
        finished: list[Request] = self._score_prompts() if self.waiting else []
        room = self.max_running_requests - len(self.reqs)
        if self.waiting and room > 0:
            admit, self.waiting = self.waiting[:room], self.waiting[room:]
            finished += self._prefill(admit)
        if self.reqs:
            rows = slice(0, self.state.rows)
            with routed_experts.capture(self.model, self.reqs, routed_experts.decode_split(len(self.reqs))):
                self.runner.decode_sample(self.state)
            self._inflight.append((list(self.reqs), self.state.fetch(rows)))
            self.state.fed(rows)
        if self._inflight and (not self.overlap or len(self._inflight) > 1 or not self.reqs):
            reqs, fetch = self._inflight.pop(0)
            finished += self._apply(reqs, fetch)
        self.hooks.after_step(started)
        return finished

    def _score_prompts(self) -> list[Request]:
        """Prompt log-probs of waiting requests that asked for them; prefill-only ones
        (``max_new_tokens`` 0) finish here without entering the decode batch."""
        for r in self.waiting:
            if r.logprob_start_len >= 0 and r.input_logprobs is None:
                r.input_logprobs = self.prompt_logprobs(r.input_ids, r.logprob_start_len, r.params.temperature)
            if r.max_new <= 0:
                r.finish = {"type": "length", "length": 0}
        done = [r for r in self.waiting if r.done]
        if done:
            self.waiting = [r for r in self.waiting if not r.done]
        return done

    @torch.no_grad()
    def prompt_logprobs(self, input_ids: list[int], start: int, temperature: float) -> list[float | None]:
        """SGLang's ``input_token_logprobs`` values: ``log p(input_ids[i] | input_ids[:i])`` for
        ``i`` in ``[start, len)``, ``None`` for ``i == 0`` (nothing predicts the first token).

        One full forward of the model over the prompt (no KV cache, whatever the runner), in the
        trainer's convention (`relax.backends.torch.logprobs.log_probs_from_logits`): fp32
        ``log_softmax(logits / temperature)``, raw logits at temperature 0.
        """
        from relax.backends.torch.batch import ModelInputs
        from relax.backends.torch.logprobs import log_probs_from_logits

        first = max(start, 1)
        n = len(input_ids) - first  # tokens first .. L-1, predicted by positions first-1 .. L-2
        head: list[float | None] = [None] if start == 0 else []
        if n <= 0:
            return head
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=ids, logits_to_keep=n + 1).logits  # positions first-1 .. L-1
        inputs = ModelInputs(ids, torch.ones_like(ids), torch.arange(n, device=self.device).unsqueeze(0),
                             ids[:, first:], torch.ones(1, n, dtype=torch.bool, device=self.device))
        lp, _ = log_probs_from_logits(logits, inputs, temperature=temperature, with_entropy=False)
        return head + lp[0].tolist()

    def _prefill(self, reqs: list[Request]) -> list[Request]:
        prompts = [r.input_ids for r in reqs]
        with routed_experts.capture(self.model, reqs, routed_experts.prefill_split(prompts)):
            if isinstance(self.runner, VisionRunner):
                logits = self.runner.prefill(prompts, [r.media for r in reqs])
            else:
                logits = self.runner.prefill(prompts)
        rows = self.state.append([r.params for r in reqs], [r.seed for r in reqs],
                                 [len(r.input_ids) + len(r.output_ids) for r in reqs], [len(r.input_ids) for r in reqs])
        self.state.sample(logits, rows)
        self.reqs += reqs
        fetch = self.state.fetch(rows)
        self.state.advance(rows)
        return self._apply(reqs, fetch)

    def _apply(self, reqs: list[Request], fetch: Fetch) -> list[Request]:
        """Append fetched tokens to the requests still running (rows of ``reqs``), drop the finished."""
        tokens, logprobs = fetch.result()
        finished = []
        for r, tok, lp in zip(reqs, tokens, logprobs, strict=True):
            if r.done:  # finished or aborted since this step was launched: a wasted row
                continue
            r.output_ids.append(tok)
            r.logprobs.append(self.hooks.logprob(lp, len(r.output_ids)))
            self._check_finish(r, tok)
            if r.done:
                finished.append(r)
        if finished:
            self._drop_finished()
        return finished

    def _drop_finished(self) -> None:
        keep = [i for i, r in enumerate(self.reqs) if not r.done]
        if len(keep) == len(self.reqs):
            return
        order = self.runner.keep(keep)
        self.state.keep(order)
        self.reqs = [self.reqs[i] for i in order]

    def _check_finish(self, r: Request, token: int) -> None:
        """SGLang's order (``Req.check_finished``): the length limit first, then EOS / stop token ids (unless
        ``ignore_eos``), then stop strings. ``text`` drops the matched stop token or string unless
        ``no_stop_trim`` (SGLang's detokenizer ``trim_matched_stop``); ``output_ids`` keep every token."""
        if len(r.output_ids) >= r.max_new:
            r.finish = {"type": "length", "length": len(r.output_ids)}
            return
        if not r.params.ignore_eos and (token in self.eos_token_ids or token in r.params.stop_token_ids):
            r.finish = {"type": "stop", "matched": token}
            if not r.params.no_stop_trim:
                r.text = self._decode(r.output_ids[:-1], r.params.skip_special_tokens)
            return
        if r.params.stop:
            text = self._decode(r.output_ids, r.params.skip_special_tokens)
            hits = [(text.find(s), s) for s in r.params.stop if s in text]
            if hits:
                at, stop = min(hits)
                r.finish = {"type": "stop", "matched": stop}
                r.text = text if r.params.no_stop_trim else text[:at]

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def update_weights_from_tensors(self, named_tensors: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                                    version: int | str | None = None) -> int:
        """Copy tensors into the model by HF name (all names checked first). ``version`` (when given) becomes the
        served weight version, as SGLang's ``weight_version`` field: a sync sends it with its last bucket."""
        if self._discarded:
            raise RuntimeError("engine weights are released (discarded, no CPU backup); call "
                               "resume_memory_occupation before updating them")
        items = list(named_tensors.items() if isinstance(named_tensors, dict) else named_tensors)
        state = self.checkpoint_state()
        for name, tensor in items:
            if name not in state:
                raise ValueError(f"unknown weight {name!r} (not in the engine model's state dict)")
            if tuple(tensor.shape) != tuple(state[name].shape):
                raise ValueError(f"weight {name!r} has shape {list(tensor.shape)}, "
                                 f"the engine expects {list(state[name].shape)}")
        if items:  # one multi-tensor copy (a few kernel launches on a GPU) instead of one launch per tensor
            torch._foreach_copy_([state[name] for name, _ in items],
                                 [tensor.to(state[name].device, state[name].dtype) for name, tensor in items])
        if self._unwritten:
            self._mark_written([state[name] for name, _ in items])
        if version is not None:
            self._weight_version = int(version)
        return self._weight_version

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The model's tensors under HF checkpoint names, as SGLang loads them and trainers send them (MoE
        experts per expert: views of transformers' fused tensors, relax/models/checkpoint_names.py)."""
        return checkpoint_state(self.model.state_dict(), moe_style(self.model.config))

    def weight_checksums(self) -> dict[str, str]:
        return state_checksums(self.checkpoint_state().items())

    def flush_cache(self) -> bool:
        """Nothing is cached across requests (no prefix cache); succeeds when idle like SGLang."""
        return not self.has_work()

    # ------------------------------------------------------------------ memory
    @property
    def released(self) -> bool:
        return bool(self.released_tags)

    def release_memory_occupation(self, tags: Iterable[str] | None = None) -> None:
        """SGLang's ``/release_memory_occupation``: free what ``tags`` name (None: all of `MEMORY_TAGS`).

        ``kv_cache`` drops the KV cache (``cuda_graph`` releases the cache too); the static runner drops its
        CUDA graphs with it, the lean runner keeps them for when its cache and weight buffer come back at the
        addresses they were captured over, and captures again when they do not (`lean_runner`).
        ``weights``, as SGLang: without ``weights_cpu_backup`` (its ``--enable-weights-cpu-backup``, off by
        default) the parameters' memory is freed and their values are lost (buffers, such as RoPE tables,
        are kept), so a resume must be followed by a weight sync that writes every parameter, and
        generation is refused until it has (`_unwritten_message`); with it they are parked in pinned host
        memory (GPU; on a CPU device they stay where they are) and come back at resume. Requires an idle
        engine (abort or finish requests first), as SGLang does.
        """
        tags = _memory_tags(tags)
        if self.has_work():
            raise RuntimeError("cannot release memory while requests are running")
        if tags & {"kv_cache", "cuda_graph"}:
            self.reqs, self._inflight = [], []
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.state.clear()
            self.runner.reset()
            tags |= {"kv_cache", "cuda_graph"}
        weights = "weights" in tags and "weights" not in self.released_tags
        if weights:  # before the runner frees the buffer the parameters are views of (at once, on CUDA)
            if not self.weights_cpu_backup:
                self._discard_weights()
            elif self.device.type == "cuda":
                self._park_weights()
        if (weights or "kv_cache" in tags) and isinstance(self.runner, LeanRunner):
            self.runner.free(weights=weights)  # the cache and the weight buffer; its graphs wait for them to return
        elif (weights or "kv_cache" in tags) and isinstance(self.runner, StaticRunner):
            self.runner.free()  # the cache and the graphs captured over it
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.released_tags |= tags

    def _park_weights(self) -> None:
        """Move every weight into pinned host buffers allocated once and reused by each release (a colocate
        run releases every step; pinning fresh host memory each time costs more than the copy itself)."""
        tensors = list(itertools.chain(self.model.parameters(), self.model.buffers()))
        if [(h.shape, h.dtype) for h in self._parking] != [(t.shape, t.dtype) for t in tensors]:
            self._parking = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
        for t, host in zip(tensors, self._parking, strict=True):
            host.copy_(t.data, non_blocking=True)
        torch.cuda.synchronize(self.device)
        for t, host in zip(tensors, self._parking, strict=True):
            t.data = host

    def _discard_weights(self) -> None:
        """Free every parameter's memory, keeping its shape to re-allocate at resume (what SGLang's memory
        saver does to the weights without a CPU backup). Tied parameters are one entry."""
        self._discarded = [(name, p, p.shape) for name, p in self.model.named_parameters()]
        for _, p, _ in self._discarded:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _mark_unwritten(self, discarded: list[tuple[str, torch.nn.Parameter, torch.Size]]) -> None:
        """List the re-allocated parameters and the pieces weight updates write them in: their checkpoint-name
        views (the whole tensor for a dense weight, one per expert and projection of a fused MoE tensor; tied
        names are one piece). A parameter is written once all its pieces are."""
        self._unwritten = {id(p): name for name, p, _ in discarded}
        self._spans = [(p.data_ptr(), p.data_ptr() + p.numel() * p.element_size(), id(p)) for _, p, _ in discarded]
        self._pieces = {}
        for tensor in self.checkpoint_state().values():
            owner = self._owner(tensor)
            if owner is not None:
                self._pieces.setdefault(owner, set()).add((tensor.data_ptr(), tensor.numel()))

    def _mark_written(self, tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            owner = self._owner(tensor)
            pieces = self._pieces.get(owner)
            if pieces is None:
                continue
            pieces.discard((tensor.data_ptr(), tensor.numel()))
            if not pieces:
                self._unwritten.pop(owner, None)
                del self._pieces[owner]

    def _owner(self, tensor: torch.Tensor) -> int | None:
        """id of the re-allocated parameter whose memory holds ``tensor`` (a view of it), if any."""
        return next((pid for lo, hi, pid in self._spans if lo <= tensor.data_ptr() < hi), None)

    def _unwritten_message(self) -> str:
        names = sorted(self._unwritten.values())
        return (f"{len(names)} weight tensor(s) hold no values since resume_memory_occupation (released without a "
                f"CPU backup, SGLang's default), e.g. {names[0]!r}: update every weight (/update_weights_from_tensor, "
                "/update_weights_from_distributed or /update_weights_from_disk) before generating, or keep a backup "
                "(--enable-weights-cpu-backup)")

    def resume_memory_occupation(self, tags: Iterable[str] | None = None) -> None:
        """Take back what ``tags`` name (None: all); the KV cache is re-allocated on the next request.

        Discarded weights come back as uninitialised memory, listed in ``_unwritten`` until a weight update
        writes them."""
        tags = _memory_tags(tags)
        if tags & {"kv_cache", "cuda_graph"}:
            tags |= {"kv_cache", "cuda_graph"}
        if "weights" in tags and self._discarded:
            # the lean runner allocates its one weight buffer again, at the address its graphs expect if it can
            if not (isinstance(self.runner, LeanRunner) and self.runner.restore_weights()):
                for _, p, shape in self._discarded:
                    p.data = torch.empty(shape, dtype=p.dtype, device=self.device)
            self._mark_unwritten(self._discarded)
            self._discarded = []
        elif "weights" in tags and self.device.type == "cuda" and "weights" in self.released_tags:
            tensors = list(itertools.chain(self.model.parameters(), self.model.buffers()))
            parked = [t.data for t in tensors]
            # the lean runner's parameters go back to their views of its weight buffer (its graphs' addresses)
            in_buffer = isinstance(self.runner, LeanRunner) and self.runner.restore_weights()
            for t, host in zip(tensors, parked, strict=True):
                if in_buffer and t.data.device.type == "cuda":
                    t.data.copy_(host, non_blocking=True)
                else:
                    t.data = host.to(self.device, non_blocking=True)
            torch.cuda.synchronize(self.device)
        self.released_tags -= tags


def _memory_tags(tags: Iterable[str] | None) -> set[str]:
    if tags is None:
        return set(MEMORY_TAGS)
    tags = set(tags)
    unknown = sorted(tags - set(MEMORY_TAGS))
    if unknown:
        raise ValueError(f"unknown memory tag(s): {', '.join(unknown)}; one of {', '.join(MEMORY_TAGS)}")
    return tags


def _logprob_start_len(value: Any, prompt_len: int) -> int:
    """SGLang's ``logprob_start_len``: -1 (default) returns no prompt log-probs, else 0 <= value < prompt_len."""
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < prompt_len:
        raise ValueError(f"logprob_start_len must be -1 or an integer in [0, {prompt_len}) for this prompt, "
                         f"got {value!r}")
    return value
