"""Generate docs/rewards.md from the code: ``python -m relax.utils.hook_docs > docs/rewards.md``.

The ``--rm-type`` values come from the grader registry (each grader's docstring), the hook
signatures from the constants their loaders quote in errors, so the page cannot drift from either.
"""

from __future__ import annotations

import inspect
import sys


def hooks() -> list[tuple[str, str, str]]:
    """(flag, signature, when it runs) for every user hook loaded by dotted path."""
    from relax.algorithms.policy_loss import CUSTOM_LOSS_SIGNATURE
    from relax.algorithms.reducers import REDUCER_SIGNATURE
    from relax.algorithms.tis import TIS_SIGNATURE
    from relax.backends.torch import rollout_postprocess
    from relax.core.train_data import CONVERT_SIGNATURE, POST_PROCESS_SIGNATURE
    from relax.data.prompts import CUSTOM_PROMPT_SIGNATURE
    from relax.engine.rewards import CUSTOM_RM_SIGNATURE, GROUP_RM_SIGNATURE
    from relax.engine.rollout.data_source import BUFFER_FILTER_SIGNATURE
    from relax.engine.rollout.interaction_env import ENV_FACTORY_SIGNATURE
    from relax.engine.rollout.sglang_rollout import GENERATE_SIGNATURE
    from relax.engine.rollout.state import FILTER_SIGNATURE
    from relax.models import provider

    return [
        ("--custom-rm-path", CUSTOM_RM_SIGNATURE, "per sample after generation (sync or async); a dict needs "
         "--reward-key, its other numeric keys are logged as rollout/reward_extra/<key>"),
        ("--custom-rm-path with --group-rm", GROUP_RM_SIGNATURE, "once per group (the samples of one prompt)"),
        ("--custom-generate-function-path", GENERATE_SIGNATURE, "per sample instead of the default generation; "
         "evaluation=True during eval when declared; POST to http://{sglang_router_ip}:{sglang_router_port}/generate"),
        ("rollout_interaction_env_path (--custom-config-path)", ENV_FACTORY_SIGNATURE,
         "per sample by the multi-turn rollout (relax.engine.rollout.multi_turn)"),
        ("--custom-prompt-path", CUSTOM_PROMPT_SIGNATURE, "per record when the dataset is read"),
        ("--dynamic-sampling-filter-path", FILTER_SIGNATURE, "per group after rewards; False drops the group"),
        ("--buffer-filter-path", BUFFER_FILTER_SIGNATURE, "when recycled groups are drawn again"),
        ("--custom-reward-post-process-path", POST_PROCESS_SIGNATURE, "per step on all samples; its rewards replace "
         "GRPO's group normalization"),
        ("--custom-convert-samples-to-train-data-path", CONVERT_SIGNATURE, "per step, replacing the conversion"),
        ("--rollout-data-postprocess-path", rollout_postprocess.SIGNATURE, "in the trainer, after log-probs and "
         "advantages, before the optimizer steps (edit loss_masks / advantages)"),
        ("--custom-loss-function-path", CUSTOM_LOSS_SIGNATURE, "per micro-batch with --loss-type custom_loss"),
        ("--custom-tis-function-path", TIS_SIGNATURE, "per micro-batch, the importance weights"),
        ("--custom-pg-loss-reducer-function-path", REDUCER_SIGNATURE, "per micro-batch, reducing pg_loss"),
        ("--custom-model-provider-path (torch)", provider.TORCH_SIGNATURE, "once per trainer rank, building the "
         "policy from --hf-checkpoint's config (and once at launch on the meta device); the checkpoint's names"),
        ("--custom-model-provider-path (megatron)", provider.MEGATRON_SIGNATURE, "once per trainer rank and model "
         "(policy, reference), this pipeline stage's GPTModel; the checkpoint's weight layout"),
    ]


def _doc(fn) -> str:
    return " ".join(inspect.getdoc(fn).split()) if inspect.getdoc(fn) else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    from relax.engine.rewards import reference_graders
    from relax.engine.rewards.graders import GRADER_REWARD_KEYS, GRADERS

    lines = ["# Rewards and hooks", "",
             "Generated from the code by `python -m relax.utils.hook_docs`; do not edit by hand.", "",
             "## `--rm-type`: built-in rewards", "",
             "A built-in reward is used when `--custom-rm-path` is not set. Each scores one sample "
             "(`sample.response` against `sample.label`).", "",
             "| `--rm-type` | returns | what it does |", "|---|---|---|"]
    for name, fn in GRADERS.items():
        returns = f"dict (`--reward-key` defaults to `{GRADER_REWARD_KEYS[name]}`)" if name in GRADER_REWARD_KEYS \
            else "float"
        lines.append(f"| `{name}` | {returns} | {_cell(_doc(fn))} |")
    lines += ["", "How `math`, `deepscaler` and `dapo` follow the public graders:", "",
              inspect.getdoc(reference_graders).split("\n\n", 1)[1], "",
              "## Hooks: dotted paths and their signatures", "",
              "Every hook is `package.module.function`, loaded once; an import error or a wrong signature is "
              "one line naming the flag, the path and the signature below. An exception a hook raises during the "
              "run ends it with one line naming the hook (and the sample, where there is one) and the file and "
              "line (`--debug` or `RELAX_DEBUG=1` adds the traceback).", "",
              "| flag | signature | called |", "|---|---|---|"]
    for flag, signature, when in hooks():
        lines.append(f"| `{_cell(flag)}` | `{_cell(signature)}` | {_cell(when)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
