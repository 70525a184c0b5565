"""``--only-train-params-name-list`` / ``--freeze-params-name-list``: which parameters train.

Patterns are Python regexes matched with `re.search` against the backend's own parameter
names: HF names for the torch backend (``model.embed_tokens.weight``, ``lm_head.weight``),
megatron-core names for the Megatron backend (``embedding.word_embeddings.weight``,
``output_layer.weight``, as in the seed's example ``--freeze-params-name-list embedding
output_layer``). A parameter reachable under several names (tied embeddings) matches if any of
them does. Frozen parameters get ``requires_grad = False`` before the optimizer is built, so
they are in no optimizer (no update, no weight decay, no Adam state) and keep their values.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable

import torch

from relax.utils.flag_types import ConfigError


def _names_by_param(module: torch.nn.Module) -> dict[torch.nn.Parameter, list[str]]:
    names: dict[torch.nn.Parameter, list[str]] = defaultdict(list)
    for name, param in module.named_parameters(remove_duplicate=False):
        names[param].append(name)
    return names


def apply_param_freezing(module: torch.nn.Module, only: list[str] | None, freeze: list[str] | None, *, rename: Callable[[str], str] | None = None,
                         across_ranks: Callable[[set[str], int], tuple[set[str], int]] | None = None) -> list[str]:
    """Set ``requires_grad`` from ``--only-train-params-name-list`` (``only``) and ``--freeze-params-name-list``
    (``freeze``); returns the frozen parameters' names (first name each).

    Raises ConfigError naming a pattern that matches no parameter, or when nothing is left to train.
    A model split over ranks (Megatron's pipeline / expert parallelism) passes ``rename`` (a local
    parameter name -> the name the patterns see, with global layer indices) and ``across_ranks``
    (this rank's used patterns and trainable count -> every rank's), so both errors look at the whole
    model, not one stage.
    """
    if only and freeze:
        raise ConfigError("--only-train-params-name-list and --freeze-params-name-list cannot be used together")
    if not only and not freeze:
        return []
    flag = "--only-train-params-name-list" if only else "--freeze-params-name-list"
    patterns = [re.compile(p) for p in (only or freeze)]
    names = _names_by_param(module)
    used: set[str] = set()
    frozen: list[str] = []
    for param, aliases in names.items():
        seen = [rename(n) for n in aliases] if rename else aliases
        hits = {p.pattern for p in patterns if any(p.search(n) for n in seen)}
        used |= hits
        keep = bool(hits) if only else not hits
        param.requires_grad_(keep)
        if not keep:
            frozen.append(aliases[0])
    trainable = len(names) - len(frozen)
    if across_ranks is not None:
        used, trainable = across_ranks(used, trainable)
    unused = [p.pattern for p in patterns if p.pattern not in used]
    if unused:
        sample = ", ".join((rename or str)(n[0]) for n in list(names.values())[:4])
        raise ConfigError(f"{flag}: pattern(s) {unused} match no parameter name (names look like: {sample}, ...)")
    if trainable == 0:
        raise ConfigError(f"{flag} {' '.join(p.pattern for p in patterns)} leaves no parameter to train")
    return frozen
