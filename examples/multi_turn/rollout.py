"""A two-turn arithmetic environment, written the way Relax recipes are (seed 001).

Turn 1: the prompt is ``a+b=`` and the model answers one digit, ``(a+b) mod 10``.
Turn 2: the environment appends ``+c=`` and the model answers ``(a+b+c) mod 10``.
Environment tokens are part of the response but get ``loss_mask`` 0 (and log-prob 0), so the
policy is trained only on its own tokens. The reward is the share of correct answers.

    relax train --preset quickstart --prompt-data examples/multi_turn/data.jsonl \
      --custom-generate-function-path examples.multi_turn.rollout.generate \
      --custom-rm-path examples.multi_turn.rollout.reward
"""

from __future__ import annotations

from relax.engine.rollout.sglang_rollout import GenerateState
from relax.utils.http_utils import post
from relax.utils.types import Sample

TURNS = 2


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    tokenizer = GenerateState(args).tokenizer
    prompt_len = len(sample.tokens)
    tokens, loss_mask, log_probs, answers = list(sample.tokens), [], [], []
    for turn in range(TURNS):
        params = dict(sampling_params, sampling_seed=sampling_params["sampling_seed"] + turn)
        out = await post(url, {"input_ids": tokens, "sampling_params": params, "return_logprob": True})
        ids = out["output_ids"]
        tokens += ids
        loss_mask += [1] * len(ids)
        log_probs += [item[0] for item in out["meta_info"]["output_token_logprobs"]]
        answers.append(tokenizer.decode(ids, skip_special_tokens=True))
        sample.weight_version = out["meta_info"]["weight_version"]
        if turn + 1 < TURNS:
            env = tokenizer.encode(f"+{sample.metadata['c']}=", add_special_tokens=False)
            tokens += env
            loss_mask += [0] * len(env)
            log_probs += [0.0] * len(env)
    sample.tokens = tokens
    sample.response_length = len(tokens) - prompt_len
    sample.loss_mask = loss_mask
    sample.rollout_log_probs = log_probs
    sample.response = tokenizer.decode(tokens[prompt_len:])
    sample.metadata = {**sample.metadata, "answers": answers}
    sample.status = Sample.Status.COMPLETED
    return sample


def reward(args, sample: Sample, **kwargs) -> float:
    expected = str(sample.label).split(",")
    got = sample.metadata.get("answers", [])
    return sum(g.strip() == e for g, e in zip(got, expected, strict=False)) / len(expected)


def make_data(path: str) -> None:
    """``python -c 'from examples.multi_turn.rollout import make_data; make_data("examples/multi_turn/data.jsonl")'``."""
    import json

    with open(path, "w") as fh:
        for a in range(10):
            for b in range(10):
                c = (a * 3 + b * 7) % 10
                label = f"{(a + b) % 10},{(a + b + c) % 10}"
                fh.write(json.dumps({"prompt": f"{a}+{b}=", "label": label, "metadata": {"c": c}}) + "\n")
