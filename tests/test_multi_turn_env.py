"""The multi-turn env rollout (seed 004's BaseInteractionEnv + build_env shape) against a scripted engine:
turns, masks, per-turn seeds, budgets, chat rendering of observations; and custom generate's ``evaluation``."""

from __future__ import annotations

import asyncio
from argparse import Namespace

import pytest

from relax.engine.rollout import multi_turn
from relax.engine.rollout.config import RolloutConfig
from relax.engine.rollout.interaction_env import BaseInteractionEnv
from relax.engine.rollout.sglang_rollout import GenerateState, custom_generate
from relax.models import load_tokenizer
from relax.utils.types import Sample

TOK = load_tokenizer("tiny-qwen3")  # character tokenizer with a ChatML template, eos <|im_end|>


class CountingEnv(BaseInteractionEnv):
    """Replies "+1=" until ``stop_after`` answers; records what it saw."""

    instances: list = []

    def __init__(self, stop_after: int):
        self.stop_after, self.seen, self.closed = stop_after, [], False
        CountingEnv.instances.append(self)

    def reset(self):
        return {"obs_str": "ignored: the prompt is the first observation"}, {}

    def step(self, response_text: str):
        self.seen.append(response_text)
        done = len(self.seen) >= self.stop_after
        return (None if done else {"obs_str": "+1=", "role": "user"}), done, {"n": len(self.seen)}

    def close(self) -> None:
        self.closed = True


def build_env(sample=None, args=None, **_):
    return CountingEnv(stop_after=sample.metadata["stop_after"])


class ScriptedEngine:
    """Answers /generate with fixed tokens ("7", then EOS unless cut), recording each request."""

    def __init__(self, answer: str = "7", eos: bool = True, version: str = "3"):
        self.requests, self.answer, self.eos, self.version = [], answer, eos, version

    async def post(self, url, payload, **_):
        self.requests.append({**payload, "input_ids": list(payload["input_ids"])})  # as sent (HTTP copies)
        ids = TOK.encode(self.answer, add_special_tokens=False)[: payload["sampling_params"]["max_new_tokens"]]
        finish = "length"
        if self.eos and len(ids) < payload["sampling_params"]["max_new_tokens"]:
            ids, finish = ids + [TOK.eos_token_id], "stop"
        return {"text": self.answer, "output_ids": ids,
                "meta_info": {"output_token_logprobs": [[-0.5, t, None] for t in ids], "weight_version": self.version,
                              "finish_reason": {"type": finish}}}


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> ScriptedEngine:
    import relax.utils.http_utils as http_utils

    scripted = ScriptedEngine()
    monkeypatch.setattr(http_utils, "post", scripted.post)
    CountingEnv.instances.clear()
    return scripted


def _args(**kw) -> Namespace:
    from relax.utils.arguments import parse_args

    args = parse_args(["--preset", "quickstart"])
    settings = dict(max_turns=3, rollout_interaction_env_path=__name__, sglang_router_ip="127.0.0.1",
                    sglang_router_port=1)
    for key, value in {**settings, **kw}.items():
        setattr(args, key, value)
    GenerateState.install(RolloutConfig.from_args(args), tokenizer=TOK, pool=None)
    return args


def _run(args: Namespace, sample: Sample, seed: int = 11, max_new: int = 64) -> Sample:
    params = {"temperature": 1.0, "max_new_tokens": max_new, "sampling_seed": seed}
    return asyncio.run(multi_turn.generate(args, sample, params))


def test_turns_masks_seeds_and_versions(engine: ScriptedEngine) -> None:
    prompt = TOK.encode("3+4=", add_special_tokens=False)
    sample = _run(_args(), Sample(index=0, tokens=list(prompt), metadata={"stop_after": 2}))
    obs = TOK.encode("+1=", add_special_tokens=False)
    seven = TOK.encode("7", add_special_tokens=False) + [TOK.eos_token_id]
    assert sample.tokens == prompt + seven + obs + seven
    assert sample.loss_mask == [1, 1] + [0, 0, 0] + [1, 1]
    assert sample.rollout_log_probs == [-0.5, -0.5, 0.0, 0.0, 0.0, -0.5, -0.5]
    assert sample.response_length == 7 and sample.status is Sample.Status.COMPLETED
    seeds = [r["sampling_params"]["sampling_seed"] for r in engine.requests]
    assert seeds == [multi_turn.turn_seed(11, 0), multi_turn.turn_seed(11, 1)] and len(set(seeds)) == 2
    assert engine.requests[1]["input_ids"] == prompt + seven + obs  # each turn sees the whole conversation
    assert sample.weight_version == 3 and sample.token_weight_versions == [3] * 7
    assert [t["text"] for t in sample.metadata["turns"]] == ["7", "7"] and sample.metadata["env_info"] == {"n": 2}
    env = CountingEnv.instances[0]
    assert env.seen == ["7", "7"] and env.closed


def test_max_turns_and_the_response_budget(engine: ScriptedEngine) -> None:
    prompt = TOK.encode("3+4=", add_special_tokens=False)
    sample = _run(_args(max_turns=2), Sample(tokens=list(prompt), metadata={"stop_after": 99}))
    assert len(sample.metadata["turns"]) == 2 and sample.status is Sample.Status.COMPLETED
    engine.requests.clear()
    sample = _run(_args(), Sample(tokens=list(prompt), metadata={"stop_after": 99}), max_new=6)
    # 2 + 3 observation tokens leave 1 for the second turn, which the budget cuts
    assert sample.response_length == 6 and sample.status is Sample.Status.TRUNCATED
    assert [r["sampling_params"]["max_new_tokens"] for r in engine.requests] == [6, 1]


def test_a_per_turn_cap_does_not_end_the_trajectory(engine: ScriptedEngine) -> None:
    engine.answer, engine.eos = "12", False
    prompt = TOK.encode("3+4=", add_special_tokens=False)
    sample = _run(_args(max_tokens_per_turn=1), Sample(tokens=list(prompt), metadata={"stop_after": 2}))
    assert sample.loss_mask == [1, 0, 0, 0, 1] and sample.status is Sample.Status.COMPLETED


def test_chat_observations_are_rendered_by_the_template(engine: ScriptedEngine) -> None:
    prompt_text = TOK.apply_chat_template([{"role": "user", "content": "3+4="}], tokenize=False,
                                          add_generation_prompt=True)
    prompt = TOK.encode(prompt_text, add_special_tokens=False)
    sample = _run(_args(apply_chat_template=True), Sample(tokens=list(prompt), metadata={"stop_after": 2}))
    rendered = TOK.decode(sample.tokens, skip_special_tokens=False)
    full = TOK.apply_chat_template([{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"},
                                    {"role": "user", "content": "+1="}], tokenize=False, add_generation_prompt=True)
    assert rendered == full + "7<|im_end|>"  # exactly what the template writes for the conversation


def test_missing_recipe_settings_name_the_yaml(engine: ScriptedEngine) -> None:
    with pytest.raises(ValueError, match="needs max_turns >= 1, got None: set it in the --custom-config-path YAML"):
        _run(_args(max_turns=None), Sample(tokens=[5], metadata={"stop_after": 1}))
    with pytest.raises(ValueError, match="needs rollout_interaction_env_path"):
        _run(_args(rollout_interaction_env_path=None), Sample(tokens=[5], metadata={"stop_after": 1}))


async def _with_evaluation(args, sample, sampling_params, evaluation: bool = False):
    sample.metadata = {"evaluation": evaluation, "seed": sampling_params["sampling_seed"]}
    return sample


async def _without_evaluation(args, sample, sampling_params):
    sample.metadata = {"seed": sampling_params["sampling_seed"]}
    return sample


@pytest.mark.parametrize("fn, expected", [("_with_evaluation", {"evaluation": True, "seed": 5}),
                                          ("_without_evaluation", {"seed": 5})])
def test_custom_generate_gets_evaluation_true_during_eval_when_it_declares_it(fn: str, expected: dict) -> None:
    from relax.utils.arguments import parse_args

    cfg = RolloutConfig.from_args(parse_args(["--preset", "quickstart", "--custom-generate-function-path",
                                              f"{__name__}.{fn}", "--hook-timeout", "300"]))
    samples = [Sample(index=0)]
    asyncio.run(custom_generate(cfg, samples, {"temperature": 1.0}, [5], evaluation=True))
    assert samples[0].metadata == expected
    asyncio.run(custom_generate(cfg, samples, {"temperature": 1.0}, [5]))
    assert samples[0].metadata == {**expected, **({"evaluation": False} if "evaluation" in expected else {})}
