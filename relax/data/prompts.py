"""Turning dataset records into prompt `Sample`s: chat template, system prompt, length filter."""

from __future__ import annotations

from typing import Any

from relax.data.dataset import DataError
from relax.utils.types import Sample


def _messages(value: Any, system_prompt: str | None) -> list[dict[str, Any]]:
    messages = [{"role": "user", "content": value}] if isinstance(value, str) else list(value)
    if system_prompt:
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def prompt_text(record_input: Any, tokenizer: Any, *, apply_chat_template: bool, system_prompt: str | None,
                tools: Any = None, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    if apply_chat_template:
        return tokenizer.apply_chat_template(
            _messages(record_input, system_prompt), tools=tools, tokenize=False, add_generation_prompt=True,
            **(chat_template_kwargs or {}),
        )
    if not isinstance(record_input, str):
        raise ValueError("a message list as input needs --apply-chat-template")
    return (system_prompt or "") + record_input


def build_samples(records: list[dict[str, Any]], tokenizer: Any, *, path: str, input_key: str,
                  label_key: str | None, metadata_key: str, apply_chat_template: bool,
                  apply_chat_template_kwargs: dict[str, Any] | None, system_prompt: str | None,
                  tool_key: str, max_prompt_len: int | None) -> tuple[list[Sample], int]:
    """Return the prompt samples and how many were dropped for exceeding ``max_prompt_len``."""
    samples: list[Sample] = []
    filtered = 0
    for i, record in enumerate(records):
        if input_key not in record:
            raise DataError(f"{path}:{i + 1}: missing key {input_key!r} (set --input-key)")
        if label_key is not None and label_key not in record:
            raise DataError(f"{path}:{i + 1}: missing key {label_key!r} (set --label-key)")
        try:
            text = prompt_text(record[input_key], tokenizer, apply_chat_template=apply_chat_template,
                               system_prompt=system_prompt, tools=record.get(tool_key),
                               chat_template_kwargs=apply_chat_template_kwargs)
        except ValueError as exc:
            raise DataError(f"{path}:{i + 1}: {exc}") from None
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if max_prompt_len is not None and len(tokens) > max_prompt_len:
            filtered += 1
            continue
        metadata = record.get(metadata_key) or {}
        samples.append(Sample(
            group_index=i, prompt=text, tokens=list(tokens),
            label=record.get(label_key) if label_key else None,
            metadata=metadata if isinstance(metadata, dict) else {"value": metadata},
        ))
    return samples, filtered
