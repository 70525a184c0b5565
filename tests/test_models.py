"""Offline model zoo, char tokenizer, synthetic tasks, HF export."""

from __future__ import annotations

import os
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.models import (
    PRESETS,
    build_config,
    build_model,
    load_tokenizer,
    param_count,
    resolve_checkpoint,
    save_hf,
)
from relax.models.tasks import TASKS, dataset_path, render
from relax.models.tokenizer import CHARACTERS, EOS_ID, PAD_ID, SPECIAL_TOKENS, VOCAB_SIZE

os.environ["HF_HUB_OFFLINE"] = "1"

TINY = ["tiny-qwen3", "tiny-qwen2", "tiny-llama"]
CPU_PRESETS = [*TINY, "small-qwen3", "small-qwen3-moe"]
PARAM_RANGE = {"tiny-qwen3": (60e3, 500e3), "tiny-qwen2": (60e3, 500e3), "tiny-llama": (60e3, 500e3),
               "small-qwen3": (1.5e6, 3e6), "small-qwen3-moe": (2e6, 2.5e6), "bench-270m": (266e6, 268e6), "qwen3-0.5b": (0.4e9, 0.5e9),
                "bench-1b": (1.0e9, 1.1e9), "tiny-qwen2.5-vl": (100e3, 200e3), "tiny-qwen2.5-vl-p14": (100e3, 200e3),
                "tiny-qwen2.5-omni": (100e3, 200e3)}
PRINTABLE = "".join(CHARACTERS)


def _params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_every_preset_has_a_size_check() -> None:
    assert set(PARAM_RANGE) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_param_counts(name: str) -> None:
    lo, hi = PARAM_RANGE[name]
    assert lo <= param_count(name) <= hi


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_config_is_consistent_with_its_tokenizer(name: str) -> None:
    cfg = build_config(name)
    tok = load_tokenizer(name)
    assert len(tok) == cfg.get_text_config().vocab_size  # a VLM's vocabulary is its language model's
    assert (cfg.pad_token_id, cfg.eos_token_id) == (tok.pad_token_id, tok.eos_token_id) == (PAD_ID, EOS_ID)
    assert cfg.bos_token_id is None and tok.bos_token is None


def test_bench_270m_is_exactly_the_machines_config() -> None:
    from transformers import Qwen3Config

    ref = Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=64).to_dict()
    got = build_config("bench-270m").to_dict()
    differing = {k for k in ref if ref[k] != got.get(k)}
    assert differing <= {"pad_token_id", "eos_token_id", "bos_token_id"}, differing
    assert abs(param_count("bench-270m") - 267e6) < 1e6  # MACHINES.md: 267M


@pytest.mark.parametrize("name", CPU_PRESETS)
def test_cpu_presets_build_deterministically_and_run(name: str) -> None:
    a, b, c = build_model(name, seed=7), build_model(name, seed=7), build_model(name, seed=8)
    assert _params_equal(a, b)
    assert not _params_equal(a, c)
    tok = load_tokenizer(name)
    ids = torch.tensor([tok.encode("1+2=")])
    with torch.no_grad():
        logits = a(input_ids=ids).logits
    assert logits.shape == (1, 4, VOCAB_SIZE) and torch.isfinite(logits).all()
    assert a.config._attn_implementation == "eager"


def test_seeded_build_leaves_global_rng_alone() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_model("tiny-qwen3", seed=1)
    assert torch.equal(torch.rand(3), expected)


def test_dtype_is_applied() -> None:
    model = build_model("tiny-qwen3", seed=0, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("name", TINY)
def test_full_forward_matches_incremental_kv_cache_decode(name: str) -> None:
    from transformers import DynamicCache

    model = build_model(name, seed=0).eval()
    ids = torch.randint(3, VOCAB_SIZE, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        out = model(input_ids=ids[:, :8], past_key_values=DynamicCache(config=model.config), use_cache=True)
        steps = [out.logits]
        for t in range(8, ids.shape[1]):
            out = model(input_ids=ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    assert (full - torch.cat(steps, dim=1)).abs().max() < 1e-5


def test_unknown_checkpoint_is_a_one_line_error() -> None:
    for fn in (build_model, load_tokenizer, resolve_checkpoint):
        with pytest.raises(ValueError) as info:
            fn("nope-model")
        msg = str(info.value)
        assert "\n" not in msg
        assert msg.startswith("--hf-checkpoint 'nope-model' is neither a model preset nor an existing directory")
        assert all(name in msg for name in PRESETS)


def test_resolve_checkpoint(tmp_path: Path) -> None:
    ckpt = resolve_checkpoint("tiny-qwen3")
    assert ckpt.kind == "preset" and ckpt.config.hidden_size == 64
    save_hf(build_model("tiny-qwen3", seed=0), load_tokenizer("tiny-qwen3"), tmp_path)
    ckpt = resolve_checkpoint(str(tmp_path))
    assert ckpt.kind == "dir" and ckpt.config.model_type == "qwen3" and ckpt.config.vocab_size == VOCAB_SIZE


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=PRINTABLE, max_size=60))
def test_char_tokenizer_round_trip(text: str) -> None:
    tok = load_tokenizer("tiny-qwen3")
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    if not any(special in text for special in SPECIAL_TOKENS):
        assert len(ids) == len(text)  # one token per character, nothing added


def test_char_tokenizer_vocab() -> None:
    tok = load_tokenizer("tiny-qwen3")
    assert VOCAB_SIZE == len(tok) <= 128
    assert set(string.digits + string.ascii_letters + string.punctuation + " \n") <= set(PRINTABLE)
    assert len({tok.convert_tokens_to_ids(d) for d in string.digits}) == 10
    assert all(len(tok.encode(str(d))) == 1 for d in range(10))
    assert tok.encode("\n\n") == [tok.convert_tokens_to_ids("\n")] * 2
    assert tok.encode("<|im_start|>user") == [1, *tok.encode("user")]  # special tokens stay whole
    assert tok.decode(tok.encode("7<|im_end|>"), skip_special_tokens=True) == "7"


def test_chat_template() -> None:
    tok = load_tokenizer("tiny-qwen3")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "1+2="}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    no_gen = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_gen == text.removesuffix("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_wordlevel_tokenizer_for_gpu_presets() -> None:
    tok = load_tokenizer("bench-270m")
    assert len(tok) == 32000
    assert tok.encode("w0 w1 w31996") == [3, 4, 31999]
    assert tok.decode([3, 4]) == "w0 w1"


def test_save_hf_round_trip(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = build_model("tiny-qwen3", seed=3).eval()
    tok = load_tokenizer("tiny-qwen3")
    out = save_hf(model, tok, tmp_path / "hf")
    assert (out / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, attn_implementation="eager").eval()
    loaded_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "3+4=\n x"
    assert loaded_tok.encode(text) == tok.encode(text)
    messages = [{"role": "user", "content": "hi"}]
    assert loaded_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (loaded_tok.pad_token_id, loaded_tok.eos_token_id) == (PAD_ID, EOS_ID)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    via_registry = build_model(str(out))  # a directory goes through from_pretrained too
    assert _params_equal(via_registry, model)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_shipped_task_data_is_what_the_generator_makes(task: str, tmp_path: Path) -> None:
    out = tmp_path / f"{task}.jsonl"
    subprocess.run([sys.executable, "-m", "relax.models.tasks", task, "--out", str(out)], check=True,
                   env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert out.read_bytes() == dataset_path(task).read_bytes() == render(task).encode()


def test_maxdigit_task_shape() -> None:
    import json

    rows = [json.loads(line) for line in dataset_path("maxdigit").read_text().splitlines()]
    assert len(rows) == 100 and len({r["prompt"] for r in rows}) == 100
    assert rows[37] == {"prompt": "3,7=", "label": "7"} and rows[73] == {"prompt": "7,3=", "label": "7"}
    tok = load_tokenizer("tiny-qwen3")
    assert all(len(tok.encode(r["label"])) == 1 for r in rows)  # one-token answers


def test_addmod_task_shape() -> None:
    import json

    rows = [json.loads(line) for line in dataset_path("addmod").read_text().splitlines()]
    assert len(rows) == 100 and len({r["prompt"] for r in rows}) == 100
    assert rows[37] == {"prompt": "3+7=", "label": "0"}
    tok = load_tokenizer("tiny-qwen3")
    assert all(len(tok.encode(r["label"])) == 1 for r in rows)  # one-token answers


def test_checkpoint_names_are_what_save_pretrained_writes(tmp_path: Path) -> None:
    """A MoE's fused in-memory experts under checkpoint names: exactly the tensors an HF save writes, as views
    (writing one writes the model)."""
    from safetensors.torch import load_file

    from relax.models.checkpoint_names import checkpoint_state, moe_style

    model = build_model("small-qwen3-moe", seed=1)
    model.save_pretrained(tmp_path)
    saved = {}
    for path in sorted(tmp_path.glob("*.safetensors")):
        saved.update(load_file(path))
    named = checkpoint_state(model.state_dict(), moe_style(model.config))
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in named and "model.layers.0.mlp.gate.weight" in named
    assert set(named) - {"lm_head.weight"} == set(saved) - {"lm_head.weight"}
    assert all(torch.equal(named[k], saved[k]) for k in saved)
    named["model.layers.1.mlp.experts.2.down_proj.weight"].fill_(0.5)
    assert bool((model.model.layers[1].mlp.experts.down_proj[2] == 0.5).all())
    assert checkpoint_state(build_model("small-qwen3").state_dict(), None).keys() == build_model("small-qwen3").state_dict().keys()


@pytest.mark.parametrize("preset", ["tiny-qwen2.5-vl", "tiny-qwen2.5-omni"])
def test_vlm_checkpoint_names_are_what_save_pretrained_writes(tmp_path: Path, preset: str) -> None:
    """A vision-language model's parts (``model.language_model.*``, ``model.visual.*``, ``model.audio_tower.*`` in
    memory since transformers 4.52) under the names its checkpoint holds (``model.*``, ``visual.*``,
    ``audio_tower.*``), as views: what SGLang's load_weights takes (relax/models/checkpoint_names.py)."""
    from safetensors.torch import load_file

    from relax.models.checkpoint_names import checkpoint_name, checkpoint_state, moe_style

    model = build_model(preset, seed=1)
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    named = checkpoint_state(model.state_dict(), moe_style(model.config))
    assert set(named) - {"lm_head.weight"} == set(saved) - {"lm_head.weight"}
    assert all(torch.equal(named[k], saved[k]) for k in saved)
    assert "visual.blocks.0.attn.proj.weight" in named and "model.embed_tokens.weight" in named
    named["visual.merger.ln_q.weight"].fill_(0.5)
    assert bool((dict(model.named_parameters())[next(n for n in model.state_dict() if n.endswith("merger.ln_q.weight"))]
                 == 0.5).all())
    assert checkpoint_name("visual.blocks.0.attn.qkv.weight") == "visual.blocks.0.attn.qkv.weight"  # kept as it is
