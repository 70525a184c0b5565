"""Turning dataset records into prompt `Sample`s: chat template, system prompt, length filter.

``Sample.prompt`` is the exact text sent to the engine and ``Sample.tokens`` its token ids
(``add_special_tokens=False``: no BOS unless the chat template writes one).

* With ``--apply-chat-template`` the input is a string (one user message) or a list of
  OpenAI messages; ``--system-prompt`` becomes a leading system message.
* Without it the input must be a string and the system prompt is a plain text prefix
  (``<system_prompt><dataset_prompt>``, as the seed documents).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relax.data.dataset import DataError, missing_key
from relax.data.multimodal import multimodal_inputs
from relax.utils.plugins import PluginError
from relax.utils.types import Sample

logger = logging.getLogger(__name__)

# --custom-prompt-path contract (seed 000): transforms the raw input before templating.
PromptFn = Callable[[Any, dict[str, Any]], Any]
CUSTOM_PROMPT_SIGNATURE = "custom_fn(prompt, data: dict) -> prompt"


def _messages(value: Any, system_prompt: str | None) -> list[dict[str, Any]]:
    if isinstance(value, str):
        messages = [{"role": "user", "content": value}]
    elif isinstance(value, list) and all(isinstance(m, dict) for m in value):
        messages = list(value)
    else:
        raise ValueError(f"input must be a string or a list of messages, got {type(value).__name__}")
    if system_prompt:
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def prompt_text(record_input: Any, tokenizer: Any, *, apply_chat_template: bool, system_prompt: str | None,
                tools: Any = None, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The engine-facing prompt text for one record's input."""
    if apply_chat_template:
        messages = _messages(record_input, system_prompt)
        try:
            return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                                 **(chat_template_kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - the template's own errors (jinja2's among them): name the record
            first = (str(exc).splitlines() or [""])[0]
            raise ValueError(f"--apply-chat-template: the tokenizer's chat template failed on this input "
                             f"({type(exc).__name__}: {first})") from None
    if not isinstance(record_input, str):
        raise ValueError(f"input is a {type(record_input).__name__}; a message list needs --apply-chat-template")
    return (system_prompt or "") + record_input


def _metadata(value: Any) -> dict[str, Any]:
    """A dict as is; a JSON-object string (common in parquet) decoded; anything else under "value"."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            return decoded
    return dict(value) if isinstance(value, dict) else {"value": value}


def _check_tokens(tokens: list[int], tokenizer: Any, where: str) -> None:
    """Refuse prompts that encode to nothing, or hold text the tokenizer maps to its pad id.

    The preset tokenizers (relax/models/tokenizer.py) map unknown text to the pad id, whose embedding is
    zero: a prompt starting with it keeps an all-zero hidden state at that position through every layer,
    and each RMSNorm's backward at zero scales the gradient by 1/sqrt(eps), overflowing to inf/NaN after
    ~12 layers. Tokenizers whose unknown token is a real token of its own are not affected.
    """
    if not tokens:
        raise DataError(f"{where}: the prompt encodes to no tokens")
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk == getattr(tokenizer, "pad_token_id", None) and unk in tokens:
        raise DataError(f"{where}: the prompt has text this tokenizer does not know (it encodes to the pad token, "
                        f"id {unk}, at {tokens.count(unk)} of {len(tokens)} positions); the word-level GPU presets "
                        "know only the words w0, w1, ... (e.g. the maxword task)")


@dataclass(frozen=True)
class SampleBuilder:
    """How one record becomes a prompt `Sample`: the record fields, the template, the length filter, the hook.

    ``prompt_fn`` is the ``--custom-prompt-path`` function (``prompt_fn_path`` its dotted path, named when it
    raises); both loaders, in-memory and streaming, build every sample through `build`.
    """

    tokenizer: Any
    input_key: str
    label_key: str | None
    metadata_key: str
    apply_chat_template: bool
    apply_chat_template_kwargs: dict[str, Any] | None
    system_prompt: str | None
    tool_key: str
    max_prompt_len: int | None
    prompt_fn: PromptFn | None = None
    prompt_fn_path: str = "<prompt_fn>"
    media: Any = None  # relax.data.multimodal.MultimodalRows with --multimodal-keys, else None

    def build(self, record: dict[str, Any], group_index: int, where: str, prepared: Any = None) -> Sample | None:
        """The sample of ``record`` (``where`` is ``file:line`` for errors), or None when it is too long.

        With ``media``, ``prepared`` is the record's `PreparedImages` when the caller started them already (the
        pool's future's result); otherwise they are prepared here."""
        for key in (self.input_key, self.label_key):
            if key is not None and key not in record:
                raise DataError(f"{where}: {missing_key(key, record)}")
        raw = record[self.input_key]
        if self.media is not None and prepared is None:
            future = self.media.submit(record, where)
            prepared = future.result() if future is not None else None
        if self.prompt_fn is not None:
            try:
                raw = self.prompt_fn(raw, record)
            except Exception as exc:  # noqa: BLE001 - a user hook: name it, the record and the error in one line
                first = (str(exc).splitlines() or [""])[0]
                raise PluginError(f"{where}: --custom-prompt-path {self.prompt_fn_path} raised "
                                  f"{type(exc).__name__}: {first}; expected {CUSTOM_PROMPT_SIGNATURE}") from None
        if self.media is not None:
            raw = self.media.expand(raw, prepared, where)
        try:
            text = prompt_text(raw, self.tokenizer, apply_chat_template=self.apply_chat_template,
                               system_prompt=self.system_prompt, tools=record.get(self.tool_key),
                               chat_template_kwargs=self.apply_chat_template_kwargs)
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from None
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        _check_tokens(tokens, self.tokenizer, where)
        if self.max_prompt_len is not None and len(tokens) > self.max_prompt_len:
            return None
        return Sample(
            group_index=group_index, prompt=text, tokens=list(tokens),
            label=record[self.label_key] if self.label_key is not None else None,
            metadata=_metadata(record.get(self.metadata_key)),
            multimodal_inputs=multimodal_inputs(prepared) if prepared is not None else None,
        )

    def build_all(self, records: list[dict[str, Any]], *, path: str,
                  first_index: int = 0) -> tuple[list[Sample], int]:
        """The samples of a file's records (``group_index`` = ``first_index`` + record index), and how many were
        too long (dropped, and logged)."""
        samples: list[Sample] = []
        # with media: every record's images start in the pool at once, and are taken in order
        futures = [self.media.submit(r, f"{path}:{i + 1}") for i, r in enumerate(records)] if self.media else []
        for i, record in enumerate(records):
            prepared = futures[i].result() if futures and futures[i] is not None else None
            sample = self.build(record, first_index + i, f"{path}:{i + 1}", prepared)
            if sample is not None:
                samples.append(sample)
        filtered = len(records) - len(samples)
        if filtered:
            logger.info("%s: dropped %d of %d prompts longer than %d tokens (--rollout-max-prompt-len)",
                        path, filtered, len(records), self.max_prompt_len)
        return samples, filtered


def build_samples(records: list[dict[str, Any]], tokenizer: Any, *, input_key: str, label_key: str | None,
                  metadata_key: str, apply_chat_template: bool,
                  apply_chat_template_kwargs: dict[str, Any] | None, system_prompt: str | None,
                  tool_key: str, max_prompt_len: int | None, path: str = "<records>",
                  prompt_fn: PromptFn | None = None, first_index: int = 0,
                  prompt_fn_path: str = "<prompt_fn>", media: Any = None) -> tuple[list[Sample], int]:
    """Return the prompt samples (``group_index`` = ``first_index`` + record index) and how many were too long.

    Records with more than ``max_prompt_len`` prompt tokens are dropped and counted. Errors
    name ``path`` and the 1-based record number.
    """
    builder = SampleBuilder(tokenizer, input_key, label_key, metadata_key, apply_chat_template,
                            apply_chat_template_kwargs, system_prompt, tool_key, max_prompt_len, prompt_fn,
                            prompt_fn_path, media)
    return builder.build_all(records, path=path, first_index=first_index)
