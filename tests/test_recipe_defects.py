"""The defects a new user hit with a real chat checkpoint and a multi-turn recipe (issue 16), reproduced.

* ``--rm-type exact`` never rewarded a chat model: the engine left the matched ``<|im_end|>`` in the
  response text (``"7<|im_end|>"``), where SGLang trims it.
* A multi-turn custom generate function that reuses the ``sampling_params`` it was given drew the
  same random numbers in every turn (identical turns).
* Fully-async training with a custom generate function that sets no ``weight_version`` (seed 001's
  example sets none) crashed after the first step.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch

from relax.utils.arguments import parse_args
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax
from tests.hf_dirs import arithmetic_corpus, bpe_tokenizer, config, hf_dir

REPO = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


def _answers_seven_then_stops(tokenizer, prompt_last: int):
    """A Qwen2 whose greedy continuation of ``prompt_last`` is "7" then ``<|im_end|>``: attention and MLP
    outputs are zero, so each position's logits depend on its own token only, through a crafted lm_head."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.Qwen2ForCausalLM(config("qwen2", tokenizer, tie_word_embeddings=False)).eval()
    seven = tokenizer.encode("7", add_special_tokens=False)
    assert len(seven) == 1
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        model.lm_head.weight.zero_()
        model.lm_head.weight[seven[0]] = 100 * emb[prompt_last]
        model.lm_head.weight[tokenizer.eos_token_id] = 100 * emb[seven[0]]
    return model


def test_exact_grader_rewards_a_chat_model_whose_eos_ends_the_answer(tmp_path: Path) -> None:
    from relax.backends.embedded.engine import EmbeddedEngine
    from relax.engine.rewards import RewardConfig, compute_rewards
    from relax.engine.rollout.config import RolloutConfig
    from relax.engine.rollout.sglang_rollout import apply_response
    from relax.utils.types import Sample

    tokenizer = bpe_tokenizer(arithmetic_corpus())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "3+4="}], tokenize=False,
                                           add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    model = _answers_seven_then_stops(tokenizer, ids[-1])
    engine = EmbeddedEngine(model, eos_token_ids=[tokenizer.eos_token_id], tokenizer=tokenizer)
    args = parse_args(["--preset", "quickstart", "--rm-type", "exact", "--rollout-temperature", "0",
                       "--rollout-max-response-len", "8"])
    params = {k: v for k, v in RolloutConfig.from_args(args).sampling_params().items() if v is not None}
    response = engine.generate([{"input_ids": ids, "sampling_params": params, "return_logprob": True}])[0]
    assert tokenizer.decode(response["output_ids"]) == "7<|im_end|>"  # the model ended its answer with EOS
    sample = apply_response(Sample(index=0, prompt=prompt, tokens=list(ids), label="7"), response)
    assert asyncio.run(compute_rewards(RewardConfig.from_args(args), [sample])) == [1.0]
    assert sample.response == "7"


@pytest.fixture
def uniform_engine(tmp_path: Path):
    """An embedded engine server over a Llama whose output distribution is uniform whatever the context."""
    import transformers as tf

    from relax.backends.embedded.launch import EngineProcess

    tokenizer = bpe_tokenizer(arithmetic_corpus())
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config("llama", tokenizer))
    with torch.no_grad():
        model.lm_head.weight.zero_()
    path = hf_dir(tmp_path / "uniform", "llama", tokenizer, model=model)
    proc = EngineProcess.start(["--hf-checkpoint", str(path), "--seed", "0"], log_dir=str(tmp_path))
    yield proc, path
    proc.stop()


def test_turns_that_reuse_the_given_seed_draw_different_tokens(uniform_engine, monkeypatch) -> None:
    """Seed 001's multi-turn shape reuses one seed for every turn; SGLang hashes the seed with the token's
    position, so the second turn (later positions) is not a replay of the first."""
    from relax.engine.rollout import sglang_rollout
    from relax.engine.rollout.config import RolloutConfig
    from relax.utils.http_utils import run_closing
    from relax.utils.types import Sample

    monkeypatch.syspath_prepend(str(REPO))
    proc, path = uniform_engine
    args = parse_args(["--preset", "quickstart", "--hf-checkpoint", str(path), "--custom-generate-function-path",
                       "tests.recipe_hooks.reuse_seed_generate", "--custom-rm-path", "tests.recipe_hooks.turn_reward"])
    args.sglang_router_ip, port = proc.url.removeprefix("http://").rsplit(":", 1)
    args.sglang_router_port = int(port)
    state = sglang_rollout.GenerateState.install(RolloutConfig.from_args(args), tokenizer=None, pool=None)
    prompt = state.tokenizer.encode("3+4=", add_special_tokens=False)
    samples = [Sample(index=i, group_index=i // 4, tokens=list(prompt), metadata={"c": 5}) for i in range(8)]

    run_closing(sglang_rollout._custom_generate(state.config, 0, state, samples))
    turns = [s.metadata["turn_tokens"] for s in samples]
    assert all(len(first) == 2 for first, _ in turns)
    assert all(first != second for first, second in turns), turns


def test_fully_async_with_a_custom_generate_that_sets_no_weight_version(tmp_path: Path, monkeypatch) -> None:
    """Such samples count as generated by the version the engines held when their rollout started."""
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--fully-async", "--max-staleness", "1",
                      "--prompt-data", str(REPO / "examples/multi_turn/data.jsonl"),
                      "--custom-generate-function-path", "tests.recipe_hooks.reuse_seed_generate",
                      "--custom-rm-path", "tests.recipe_hooks.turn_reward", "--output-dir", str(tmp_path / "run")],
                     tmp_path)
    assert_ok(proc)
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]  # it crashed in step 0's bookkeeping
    assert all(m["rollout/unversioned_samples"] == 32 for m in metrics)
    assert all(0 <= m["rollout/staleness_max"] <= 1 for m in metrics)
    assert all(m["weight_version"] <= m["step"] for m in metrics)
    assert all(m["rollout/reward_mean"] > 0.9 for m in metrics)  # turns differ (turn_reward)
