"""A running-sum tool environment (seed 004's ``env_<algo>.py`` shape: a `BaseInteractionEnv` and ``build_env``).

The prompt asks for ``(a+b) mod 10`` as one digit. After each answer the environment replies with
the next addend, ``+c=``, and the model answers the new running sum mod 10, for ``max_turns`` turns
(from the ``--custom-config-path`` YAML). The addends come from the sample's metadata
(``extra_info`` of a converted verl parquet: ``{"addends": [c, ...]}``, or ``{"c": c}``).
"""

from __future__ import annotations

from examples.arith_env.base_env import BaseInteractionEnv
from relax.utils.types import Sample


class ArithEnv(BaseInteractionEnv):
    def __init__(self, *, max_turns: int, addends: list[int]):
        self.max_turns = max_turns
        self.addends = addends
        self.answers: list[str] = []

    def reset(self):
        self.answers = []
        return None, {}

    def step(self, response_text: str):
        self.answers.append(response_text.strip())
        turn = len(self.answers)
        done = turn >= self.max_turns or turn > len(self.addends)
        info = {"answers": list(self.answers)}
        if done:
            return None, True, info
        return {"obs_str": f"+{self.addends[turn - 1]}=", "role": "user"}, False, info


def build_env(sample: Sample = None, args=None, **_) -> ArithEnv:
    meta = sample.metadata if sample is not None else {}
    addends = meta.get("addends") or ([meta["c"]] if "c" in meta else [])
    return ArithEnv(max_turns=args.max_turns if args is not None else 2, addends=[int(c) for c in addends])
