"""Offline model zoo, char tokenizer, synthetic tasks, HF export."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.models import PRESETS, build_config, build_model, load_tokenizer, save_hf
from relax.models.tasks import TASKS, dataset_path, render

TINY = ["tiny-qwen3", "tiny-qwen2", "tiny-llama", "small-qwen3"]


@pytest.mark.parametrize("name", TINY)
def test_tiny_presets_build_deterministically(name: str) -> None:
    a, b = build_model(name, seed=7), build_model(name, seed=7)
    n = sum(p.numel() for p in a.parameters())
    assert 50_000 <= n <= 2_500_000
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    c = build_model(name, seed=8)
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(), strict=True))
    tok = load_tokenizer(name)
    ids = torch.tensor([tok.encode("1+2=")])
    assert a(input_ids=ids).logits.shape == (1, 4, a.config.vocab_size)


def test_gpu_presets_have_the_documented_size() -> None:
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(build_config("bench-270m"))
    n = sum(p.numel() for p in model.parameters())
    assert 260e6 < n < 275e6  # MACHINES.md: 267M
    with torch.device("meta"):
        big = Qwen3ForCausalLM(build_config("qwen3-0.5b"))
    assert 0.3e9 < sum(p.numel() for p in big.parameters()) < 0.6e9


def test_unknown_checkpoint_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="neither a model preset nor an existing directory; presets: tiny-qwen3"):
        build_model("nope-model")


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", ""), max_size=40).filter(lambda t: "<|" not in t))
def test_char_tokenizer_round_trip(text: str) -> None:
    tok = load_tokenizer("tiny-qwen3")
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) == len(text)


def test_digits_are_single_tokens_and_chat_template() -> None:
    tok = load_tokenizer("tiny-qwen3")
    assert all(len(tok.encode(str(d))) == 1 for d in range(10))
    text = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "1+2="}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 0


def test_save_hf_round_trip(tmp_path: Path) -> None:
    model = build_model("tiny-qwen3", seed=3)
    save_hf(model, load_tokenizer("tiny-qwen3"), tmp_path / "hf")
    loaded = build_model(str(tmp_path / "hf"))
    tok = load_tokenizer(str(tmp_path / "hf"))
    ids = torch.tensor([tok.encode("3+4=")])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_shipped_task_data_is_what_the_generator_makes(task: str) -> None:
    assert dataset_path(task).read_text() == render(task)
