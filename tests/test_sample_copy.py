"""`Sample.copy`: what ``copy.deepcopy`` gives (equal, nothing mutable shared), on any sample."""

from __future__ import annotations

import copy
from dataclasses import fields

from hypothesis import given, settings
from hypothesis import strategies as st

from relax.utils import types
from relax.utils.types import Sample

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=8)
_ints = st.lists(st.integers(0, 50_000), max_size=40)
_floats = st.lists(st.floats(-30, 0), max_size=40)


@st.composite
def samples(draw) -> Sample:
    return Sample(
        index=draw(st.none() | st.integers(0, 10)), group_index=draw(st.none() | st.integers(0, 10)),
        prompt=draw(st.text(max_size=8) | st.lists(st.fixed_dictionaries({"role": st.text(max_size=4),
                                                                             "content": st.text(max_size=8)}), max_size=3)),
        label=draw(_json), metadata=draw(st.dictionaries(st.text(max_size=3), _json, max_size=3)),
        multimodal_inputs=draw(st.none() | _json), tokens=draw(_ints), response=draw(st.text(max_size=8)),
        response_length=draw(st.integers(0, 40)), loss_mask=draw(st.none() | st.lists(st.integers(0, 1), max_size=40)),
        rollout_log_probs=draw(st.none() | _floats), teacher_log_probs=draw(st.none() | _floats),
        status=draw(st.sampled_from(list(Sample.Status))), weight_version=draw(st.none() | st.integers(0, 9)),
        token_weight_versions=draw(st.none() | _ints), abort_count=draw(st.integers(0, 3)),
        reward=draw(st.none() | st.floats(-1, 1) | st.dictionaries(st.text(max_size=3), _json, max_size=2)),
    )


def _mutable_ids(value, seen: set[int]) -> set[int]:
    """ids of every list/dict reachable from ``value``."""
    if isinstance(value, list | dict) and id(value) not in seen:
        seen.add(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            _mutable_ids(item, seen)
    return seen


def test_copy_names_every_field_once():
    groups = (types._NUMBER_LISTS, types._FREE_FORM, types._SCALARS)
    named = [name for group in groups for name in group]
    assert sorted(named) == sorted(f.name for f in fields(Sample))


@settings(max_examples=200, deadline=None)
@given(samples())
def test_copy_equals_deepcopy_and_shares_nothing_mutable(sample: Sample):
    out = sample.copy()
    assert out == copy.deepcopy(sample)
    for f in fields(Sample):
        shared = _mutable_ids(getattr(sample, f.name), set()) & _mutable_ids(getattr(out, f.name), set())
        assert not shared, f"Sample.copy shares a mutable part of {f.name}"


def test_mutating_the_copy_leaves_the_prompt_alone():
    prompt = Sample(prompt=[{"role": "user", "content": "hi"}], tokens=[1, 2, 3], metadata={"k": [1]}, label=[7])
    out = prompt.copy()
    out.tokens.append(4)
    out.metadata["k"].append(2)
    out.prompt[0]["content"] = "changed"
    out.label.append(8)
    assert prompt == Sample(prompt=[{"role": "user", "content": "hi"}], tokens=[1, 2, 3], metadata={"k": [1]}, label=[7])
