"""A multi-turn rollout that drives a tool environment (seed 004's ``examples/<algo>/rollout.py``).

``generate(args, sample, sampling_params, evaluation=False)`` is a custom generate function
(``--custom-generate-function-path``): for each sample it builds the environment named by
``rollout_interaction_env_path`` (``--custom-config-path`` YAML, or the recipe's own default) and
alternates model turns and environment observations for up to ``max_turns`` model turns (same YAML):

* model tokens: ``loss_mask`` 1, their log-probs from the engine;
* observation tokens: ``loss_mask`` 0 and log-prob 0, so the policy is trained on its own tokens
  only. With ``--apply-chat-template`` an observation is rendered by the tokenizer's chat template
  as the next message (its role from the observation) followed by the generation prompt; otherwise
  its text is appended as it is.

Each turn draws with its own ``sampling_seed``, derived from the sample's (`turn_seed`), so turns
never replay each other's random numbers. ``--rollout-max-response-len`` bounds the whole response
(model and observation tokens); a trajectory that hits it is TRUNCATED. ``max_tokens_per_turn``
(optional, same YAML) caps each model turn; a turn cut there still goes to the environment. The sample's
``weight_version`` is the version that generated its last turn (``token_weight_versions`` per token),
and ``metadata["turns"]`` keeps each turn's text and seed, ``metadata["env_info"]`` the last info,
``metadata["evaluation"]`` whether it was an evaluation rollout.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass
from typing import Any

from relax.engine.protocol import parse_weight_version
from relax.engine.rollout.interaction_env import load_env_factory, observation_text
from relax.engine.rollout.sglang_rollout import GenerateState, sample_seed
from relax.utils.json_codec import logprob
from relax.utils.types import Sample

CONFIG_HINT = "set it in the --custom-config-path YAML (seed 004)"


def turn_seed(seed: int, turn: int) -> int:
    """The ``sampling_seed`` of model turn ``turn`` of a sample whose seed is ``seed`` (distinct per turn)."""
    return sample_seed(seed, 1, turn)


@dataclass(frozen=True)
class Episode:
    """What one multi-turn trajectory reads, taken from ``args`` once at the hook boundary (`generate`).

    ``max_turns``, ``max_tokens_per_turn`` and the env module are keys of the ``--custom-config-path`` YAML, not
    flags, so this is a plain checked record rather than a flag slice. ``env_args`` is the seeds' ``args``, handed
    on only to the env factory, whose signature ``build_env(sample, args)`` seed 004 fixes."""

    env_module: str
    max_turns: int
    max_tokens_per_turn: int | None
    router_url: str  # the run's router (relax/core/runtime.py sets --sglang-router-ip/port)
    chat: bool  # --apply-chat-template: render observations with the chat template
    tokenizer: Any
    env_args: Any

    def __post_init__(self) -> None:
        value = self.max_turns
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"the multi-turn rollout needs max_turns >= 1, got {value!r}: {CONFIG_HINT}")
        value = self.max_tokens_per_turn
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"max_tokens_per_turn must be an integer >= 1, got {value!r}: {CONFIG_HINT}")


def _chat_observation(tokenizer: Any, text: str, role: str, after_eos: bool) -> str:
    """What the chat template writes after an assistant turn for the next ``role`` message, then the
    generation prompt; the template's own end-of-turn text is prepended when the model did not write it."""
    history = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    base = tokenizer.apply_chat_template(history, tokenize=False)
    full = tokenizer.apply_chat_template([*history, {"role": role, "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    if not full.startswith(base):
        raise ValueError("the chat template renders earlier turns differently once a message follows; "
                         "render observations yourself in a custom generate function")
    eos = tokenizer.eos_token or ""
    end = base.rfind(eos) if eos else -1
    closing = base[end:] if end >= 0 else ""  # the assistant's end token and what follows it
    if after_eos and closing:
        closing = closing[len(eos):]
    return closing + full[len(base):]


def observation_ids(tokenizer: Any, text: str, role: str, *, chat: bool, after_eos: bool) -> list[int]:
    rendered = _chat_observation(tokenizer, text, role, after_eos) if chat else text
    return list(tokenizer.encode(rendered, add_special_tokens=False)) if rendered else []


class _Trajectory:
    """The response so far: tokens after the prompt, their loss mask, log-probs and policy versions."""

    def __init__(self, prompt: list[int]):
        self.tokens = list(prompt)
        self.mask: list[int] = []
        self.log_probs: list[float] = []
        self.versions: list[int | None] = []
        self.turns: list[dict[str, Any]] = []

    def add(self, ids: list[int], mask: int, log_probs: list[float], version: int | None) -> None:
        self.tokens += ids
        self.mask += [mask] * len(ids)
        self.log_probs += log_probs
        self.versions += [version] * len(ids)


async def run_episode(episode: Episode, sample: Sample, sampling_params: dict[str, Any],
                      evaluation: bool = False) -> Sample:
    """One sample's trajectory: model turns and environment observations, until done, max_turns or the budget."""
    from relax.utils.http_utils import post

    max_turns, cap, env_module = episode.max_turns, episode.max_tokens_per_turn, episode.env_module
    tokenizer = episode.tokenizer
    eos_ids = {tokenizer.eos_token_id} - {None}
    url = episode.router_url
    budget = int(sampling_params["max_new_tokens"])
    traj, info, status, version = _Trajectory(sample.tokens), {}, Sample.Status.COMPLETED, None
    env = load_env_factory(env_module)(sample=sample, args=episode.env_args)
    try:
        env.reset()
        for turn in range(max_turns):
            seed = turn_seed(int(sampling_params["sampling_seed"]), turn)
            left = budget - len(traj.mask)
            params = dict(sampling_params, sampling_seed=seed, max_new_tokens=min(left, cap or left))
            out = await post(url, {"input_ids": traj.tokens, "sampling_params": params, "return_logprob": True})
            meta, ids = out["meta_info"], list(out["output_ids"])
            version = parse_weight_version(meta.get("weight_version"))
            traj.add(ids, 1, [logprob(item[0]) for item in meta["output_token_logprobs"]], version)
            traj.turns.append({"text": out["text"], "sampling_seed": seed, "num_tokens": len(ids)})
            finish = meta["finish_reason"]["type"]
            if finish == "abort" or finish == "length" and len(traj.mask) >= budget:  # cut, or the budget is spent
                status = Sample.Status.ABORTED if finish == "abort" else Sample.Status.TRUNCATED
                break
            obs, done, info = env.step(out["text"])
            if done or turn + 1 == max_turns:
                break
            text, role = observation_text(obs, f"{env_module}.step")
            obs_ids = observation_ids(tokenizer, text, role, chat=episode.chat,
                                      after_eos=bool(ids) and ids[-1] in eos_ids)
            if len(traj.mask) + len(obs_ids) >= budget:  # no room for the observation and a next turn
                status = Sample.Status.TRUNCATED
                break
            traj.add(obs_ids, 0, [0.0] * len(obs_ids), version)
    finally:
        env.close()
    sample.metadata = {**sample.metadata, "evaluation": evaluation}
    return _finish(sample, traj, tokenizer, status, version, info)


def _finish(sample: Sample, traj: _Trajectory, tokenizer: Any, status: Sample.Status, version: int | None,
            info: dict[str, Any]) -> Sample:
    prompt_length = len(sample.tokens)
    sample.tokens = traj.tokens
    sample.response_length = len(traj.tokens) - prompt_length
    sample.response = tokenizer.decode(traj.tokens[prompt_length:], skip_special_tokens=False)
    sample.loss_mask, sample.rollout_log_probs = traj.mask, traj.log_probs
    sample.weight_version = version
    sample.token_weight_versions = traj.versions if version is not None else None
    sample.status = status
    sample.metadata = {**sample.metadata, "turns": traj.turns, "env_info": info}
    return sample


# seed hook: seed 001's custom generate function, generate(args, sample, sampling_params, evaluation=False)
async def generate(args: Namespace, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False,
                   *, env_module: str | None = None) -> Sample:
    """The custom generate function. ``env_module``: a recipe's default when its YAML names none.

    The YAML keys are read with ``getattr``: they are not flags, and a recipe's YAML may leave them out."""
    module = getattr(args, "rollout_interaction_env_path", None) or env_module
    if not module:
        raise ValueError(f"the multi-turn rollout needs rollout_interaction_env_path (the env module): {CONFIG_HINT}")
    episode = Episode(env_module=module, max_turns=getattr(args, "max_turns", None),
                      max_tokens_per_turn=getattr(args, "max_tokens_per_turn", None),
                      router_url=f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate",
                      chat=bool(args.apply_chat_template), tokenizer=GenerateState(args).tokenizer, env_args=args)
    return await run_episode(episode, sample, sampling_params, evaluation)
