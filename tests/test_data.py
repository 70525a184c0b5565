"""Prompt data: jsonl/parquet reading, one-line errors, chat template, data source resume."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from relax.data.dataset import DataError, read_records
from relax.data.prompts import build_samples
from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
from relax.models import load_tokenizer

TOK = load_tokenizer("tiny-qwen3")
ROWS = [{"q": f"{i}+1=", "a": str(i + 1), "metadata": {"i": i}} for i in range(7)]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(path: Path, **kw) -> Namespace:
    base = dict(prompt_data=str(path), input_key="q", label_key="a", metadata_key="metadata", tool_key="tools",
                apply_chat_template=False, apply_chat_template_kwargs={}, system_prompt=None,
                rollout_max_prompt_len=None, n_samples_per_prompt=2, rollout_shuffle=True, rollout_seed=5,
                hf_checkpoint="tiny-qwen3")
    base.update(kw)
    return Namespace(**base)


def test_jsonl_and_parquet_agree(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    j = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), p)
    assert read_records(j) == read_records(p)


@pytest.mark.parametrize("content, message", [
    ('{"q": "1"}\n{"q": \n', "d.jsonl:2: invalid JSON"),
    ('{"q": "1"}\n[1, 2]\n', "d.jsonl:2: expected a JSON object"),
])
def test_malformed_jsonl(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        read_records(tmp_path / "d.jsonl")


def test_missing_file_and_bad_extension(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="prompt data not found"):
        read_records(tmp_path / "x.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported prompt data format"):
        read_records(tmp_path / "x.csv")


def test_missing_input_key_names_line(tmp_path: Path) -> None:
    records = [{"q": "1"}, {"other": "2"}]
    with pytest.raises(DataError, match=r"d.jsonl:2: missing key 'q'"):
        build_samples(records, TOK, path="d.jsonl", input_key="q", label_key=None, metadata_key="metadata",
                      apply_chat_template=False, apply_chat_template_kwargs=None, system_prompt=None,
                      tool_key="tools", max_prompt_len=None)


def test_chat_template_system_prompt_and_length_filter() -> None:
    records = [{"q": "1+1="}, {"q": "a much longer prompt than the limit allows"}]
    samples, filtered = build_samples(records, TOK, path="d", input_key="q", label_key=None, metadata_key="m",
                                      apply_chat_template=True, apply_chat_template_kwargs=None,
                                      system_prompt="SYS", tool_key="tools", max_prompt_len=40)
    assert filtered == 1 and len(samples) == 1
    assert samples[0].prompt.startswith("<|im_start|>system\nSYS<|im_end|>")
    assert TOK.decode(samples[0].tokens) == samples[0].prompt


def test_data_source_groups_epochs_and_resume(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    src = RolloutDataSourceWithBuffer(_args(path), tokenizer=TOK)
    first = src.get_samples(3)
    assert [len(g) for g in first] == [2, 2, 2]
    assert [s.index for g in first for s in g] == list(range(6))
    assert all(g[0].group_index == g[1].group_index for g in first)
    state = src.state_dict()
    straight = [[(s.group_index, s.index, s.label) for s in g] for g in src.get_samples(6)]  # crosses an epoch
    resumed = RolloutDataSourceWithBuffer(_args(path), tokenizer=TOK)
    resumed.load_state_dict(state)
    assert [[(s.group_index, s.index, s.label) for s in g] for g in resumed.get_samples(6)] == straight
    epoch0 = {s.group_index for g in first for s in g} | {gi for g in straight[:4] for gi, _, _ in g}
    assert epoch0 == set(range(7)), "each prompt exactly once per epoch"


def test_data_source_shuffle_is_seeded(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    order = lambda seed: [g[0].label for g in RolloutDataSourceWithBuffer(_args(path, rollout_seed=seed), tokenizer=TOK).get_samples(7)]  # noqa: E731
    assert order(1) == order(1)
    assert order(1) != order(2)
    unshuffled = RolloutDataSourceWithBuffer(_args(path, rollout_shuffle=False), tokenizer=TOK).get_samples(7)
    assert [g[0].label for g in unshuffled] == [r["a"] for r in ROWS]


def test_buffer_is_served_first(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    src = RolloutDataSourceWithBuffer(_args(path), tokenizer=TOK)
    groups = src.get_samples(2)
    src.add_samples(groups[:1])
    again = src.get_samples(2)
    assert again[0] is groups[0] and again[1][0].index == 4
