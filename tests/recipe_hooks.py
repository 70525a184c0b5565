"""Recipe functions the end-to-end tests load by dotted path (``tests.recipe_hooks.<name>``)."""

from __future__ import annotations

from examples.arith_env.reward_arith import reward_func as arith_reward
from relax.engine.rollout.sglang_rollout import GenerateState
from relax.utils.http_utils import post
from relax.utils.types import Sample


async def checked_arith_reward(args, sample: Sample, **kwargs) -> dict:
    """The arith example's reward, after checking the multi-turn rollout's contract on every sample it scores:
    each turn drew with its own sampling seed, and exactly the model's tokens carry loss (observations masked)."""
    turns = sample.metadata["turns"]
    seeds = [t["sampling_seed"] for t in turns]
    if len(set(seeds)) != len(seeds):
        raise AssertionError(f"sample {sample.index}: turns share a sampling seed: {seeds}")
    model_tokens = sum(t["num_tokens"] for t in turns)
    if sum(sample.loss_mask) != model_tokens or len(sample.loss_mask) != sample.response_length:
        raise AssertionError(f"sample {sample.index}: loss mask {sample.loss_mask} for turns {turns}")
    if len(turns) > 1 and sample.response_length <= model_tokens:
        raise AssertionError(f"sample {sample.index}: {len(turns)} turns but no observation tokens")
    return await arith_reward(args, sample)


async def reuse_seed_generate(args, sample: Sample, sampling_params: dict) -> Sample:
    """Seed 001's multi-turn shape, as users write it: every turn reuses the params (and seed) it was given, and
    the function sets no ``weight_version``. Two turns of two tokens, the environment writes "+c=" between them."""
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    tokenizer = GenerateState(args).tokenizer
    prompt_len = len(sample.tokens)
    tokens, mask, log_probs, turns = list(sample.tokens), [], [], []
    for turn in range(2):
        out = await post(url, {"input_ids": tokens, "sampling_params": dict(sampling_params, max_new_tokens=2),
                               "return_logprob": True})
        ids = [t[1] for t in out["meta_info"]["output_token_logprobs"]]
        tokens += ids
        mask += [1] * len(ids)
        log_probs += [t[0] for t in out["meta_info"]["output_token_logprobs"]]
        turns.append(ids)
        if turn == 0:
            env = tokenizer.encode(f"+{sample.metadata.get('c', 1)}=", add_special_tokens=False)
            tokens += env
            mask += [0] * len(env)
            log_probs += [0.0] * len(env)
    sample.tokens, sample.loss_mask, sample.rollout_log_probs = tokens, mask, log_probs
    sample.response_length = len(tokens) - prompt_len
    sample.response = tokenizer.decode(tokens[prompt_len:])
    sample.metadata = {**sample.metadata, "turn_tokens": turns}
    sample.status = Sample.Status.COMPLETED
    return sample


def turn_reward(args, sample: Sample, **kwargs) -> float:
    """1.0 when the two turns drew different tokens (a model that samples them must, unless it replays a seed)."""
    first, second = sample.metadata["turn_tokens"]
    return float(first != second)


def raising_reward(args, sample: Sample, **kwargs) -> float:
    if sample.index == 3:
        return 1 / 0
    return 0.0


def raising_postprocess(args, rollout_id, data) -> None:
    raise KeyError("advantages_x")
