"""Prompt data: jsonl/parquet reading, one-line errors, chat template, data source epochs and resume."""

from __future__ import annotations

import json
import os
import pickle
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from relax.data.dataset import DataError, read_records
from relax.data.prompts import build_samples
from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
from relax.models import load_tokenizer
from relax.utils.types import Sample

os.environ["HF_HUB_OFFLINE"] = "1"

TOK = load_tokenizer("tiny-qwen3")
ROWS = [{"q": f"{i}+1=", "a": str(i + 1), "metadata": {"i": i}} for i in range(7)]
BUILD = dict(input_key="q", label_key="a", metadata_key="metadata", apply_chat_template=False,
             apply_chat_template_kwargs={}, system_prompt=None, tool_key="tools", max_prompt_len=None)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _args(path: Path, **kw) -> Namespace:
    base = dict(prompt_data=str(path), input_key="q", label_key="a", metadata_key="metadata", tool_key="tools",
                apply_chat_template=False, apply_chat_template_kwargs={}, system_prompt=None,
                rollout_max_prompt_len=None, n_samples_per_prompt=2, rollout_shuffle=True, rollout_seed=5,
                hf_checkpoint="tiny-qwen3", custom_prompt_path=None, buffer_filter_path=None,
                use_streaming_dataset=False, streaming_buffer_size=4, multimodal_keys=None, image_min_token_num=None,
                image_max_token_num=None, image_resize_scale_factor=None, mm_processor_pool_size=0,
                prefetch_chunk_size=32, prefetch_max_cached=256, prefetch_num_workers=1, video_min_token_num=None,
                video_max_token_num=None, video_fps=None, video_fps_min_frames=None, video_fps_max_frames=None,
                frame_factor=None, audio_sample_rate=None, use_audio_in_video=False)
    base.update(kw)
    return Namespace(**base)


def _key(groups: list[list[Sample]]) -> list[list[tuple]]:
    return [[(s.group_index, s.index, s.label, s.prompt, tuple(s.tokens)) for s in g] for g in groups]


# ---------------------------------------------------------------- reading


def test_jsonl_and_parquet_give_the_same_samples(tmp_path: Path) -> None:
    j = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    p = _write_parquet(tmp_path / "d.parquet", ROWS)
    assert read_records(j) == read_records(p) == ROWS
    sj, _ = build_samples(read_records(j), TOK, **BUILD)
    sp, _ = build_samples(read_records(p), TOK, **BUILD)
    assert [s.to_dict() for s in sj] == [s.to_dict() for s in sp]
    assert sj[3].prompt == "3+1=" and sj[3].label == "4" and sj[3].metadata == {"i": 3} and sj[3].group_index == 3
    assert TOK.decode(sj[3].tokens) == "3+1="


def test_blank_lines_are_skipped_but_counted(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"q": "1"}\n\n   \n{"x": "2"}\n')
    with pytest.raises(DataError) as info:
        read_records(tmp_path / "d.jsonl", required_keys=["q"])
    assert str(info.value) == f"{tmp_path / 'd.jsonl'}:4: missing key 'q' (the record has keys: x)"


@pytest.mark.parametrize("content, message", [
    ('{"q": "1"}\n{"q": \n', "{p}:2: invalid JSON: Expecting value (column 7)"),
    ('{"q": "1"}\n[1, 2]\n', "{p}:2: expected a JSON object, got list"),
    ('"just a string"\n', "{p}:1: expected a JSON object, got str"),
    ('{"q": "1"}\n{"input": "2"}\n', "{p}:2: missing key 'q' (the record has keys: input)"),
])
def test_malformed_jsonl_exact_messages(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text(content)
    with pytest.raises(DataError) as info:
        read_records(p, required_keys=["q"])
    assert str(info.value) == message.format(p=p)


def test_missing_file_bad_extension_and_bad_parquet(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        read_records(tmp_path / "x.jsonl")
    assert str(info.value) == f"prompt data not found: {tmp_path / 'x.jsonl'}"
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError) as info:
        read_records(tmp_path / "x.csv")
    assert str(info.value) == f"{tmp_path / 'x.csv'}: unsupported prompt data format '.csv' (use .jsonl or .parquet)"
    with pytest.raises(DataError) as info:  # a dataset's folder given for its file
        read_records(tmp_path)
    assert str(info.value) == f"prompt data {tmp_path} is a directory; give a .jsonl or .parquet file, or a list of them"
    (tmp_path / "x.parquet").write_text("not parquet\n")
    with pytest.raises(DataError) as info:
        read_records(tmp_path / "x.parquet")
    assert str(info.value).startswith(f"{tmp_path / 'x.parquet'}: cannot read parquet: ")
    assert "\n" not in str(info.value)
    (tmp_path / "b.jsonl").write_bytes(b'{"q": "\xff"}\n')
    with pytest.raises(DataError, match=r"b.jsonl: not UTF-8 text"):
        read_records(tmp_path / "b.jsonl")


def test_parquet_missing_key_names_the_row(tmp_path: Path) -> None:
    p = _write_parquet(tmp_path / "d.parquet", [{"input": "a"}, {"input": None}])
    assert read_records(p, required_keys=["input"])[1] == {"input": None}
    with pytest.raises(DataError) as info:
        read_records(p, required_keys=["q"])
    assert str(info.value) == f"{p}:1: missing key 'q' (the record has keys: input)"


def test_build_samples_missing_keys_name_record() -> None:
    with pytest.raises(DataError) as info:
        build_samples([{"q": "1", "a": "1"}, {"other": "2"}], TOK, **BUILD, path="d.jsonl")
    assert str(info.value) == "d.jsonl:2: missing key 'q' (the record has keys: other)"
    with pytest.raises(DataError) as info:
        build_samples([{"q": "1"}], TOK, **BUILD, path="d.jsonl")
    assert str(info.value) == "d.jsonl:1: missing key 'a' (the record has keys: q)"


# ---------------------------------------------------------------- prompts


def test_chat_template_with_system_prompt_string_and_messages() -> None:
    records = [{"q": "1+1="}, {"q": [{"role": "user", "content": "2+2="}]}]
    kw = dict(BUILD, label_key=None, apply_chat_template=True, system_prompt="SYS")
    samples, filtered = build_samples(records, TOK, **kw)
    assert filtered == 0
    expected = "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    assert [s.prompt for s in samples] == [expected.format("1+1="), expected.format("2+2=")]
    assert samples[0].tokens == TOK.encode(samples[0].prompt, add_special_tokens=False)
    assert samples[0].tokens[0] == TOK.convert_tokens_to_ids("<|im_start|>")
    assert samples[0].label is None and samples[0].metadata == {}


def test_system_prompt_without_chat_template_is_a_prefix() -> None:
    samples, _ = build_samples([{"q": "1+1=", "a": "2"}], TOK, **dict(BUILD, system_prompt="Add. "))
    assert samples[0].prompt == "Add. 1+1="
    assert TOK.decode(samples[0].tokens) == "Add. 1+1="


def test_message_list_needs_chat_template() -> None:
    with pytest.raises(DataError, match=r"^d:1: input is a list; a message list needs --apply-chat-template$"):
        build_samples([{"q": [{"role": "user", "content": "x"}], "a": "1"}], TOK, **BUILD, path="d")


def test_a_message_the_chat_template_cannot_render_names_its_record() -> None:
    """A message without content: the template's own jinja2 error ended the run naming no file or line."""
    with pytest.raises(DataError, match=r"^d:2: --apply-chat-template: the tokenizer's chat template failed on this "
                                        r"input \(UndefinedError: 'dict object' has no attribute 'content'\)$"):
        build_samples([{"q": "fine", "a": "1"}, {"q": [{"role": "user"}], "a": "1"}], TOK,
                      **dict(BUILD, apply_chat_template=True), path="d")


def test_max_prompt_len_filters_and_counts() -> None:
    records = [{"q": "1+1=", "a": "2"}, {"q": "a much longer prompt", "a": "x"}, {"q": "12345", "a": "y"}]
    samples, filtered = build_samples(records, TOK, **dict(BUILD, max_prompt_len=5))
    assert filtered == 1
    assert [s.group_index for s in samples] == [0, 2]  # record index survives filtering
    samples, filtered = build_samples(records, TOK, **dict(BUILD, max_prompt_len=4))
    assert filtered == 2 and [s.prompt for s in samples] == ["1+1="]


def test_prompts_the_tokenizer_cannot_spell_are_refused_naming_the_record() -> None:
    """The word-level GPU tokenizer maps unknown text to its (zero-embedding) pad id: refused, not trained on."""
    words = load_tokenizer("qwen3-0.5b")
    samples, _ = build_samples([{"q": "w3 w5", "a": "w5"}], words, **BUILD, path="d.jsonl")
    assert samples[0].tokens == [6, 8]
    with pytest.raises(DataError, match=r"^d\.jsonl:2: the prompt has text this tokenizer does not know \(it encodes "
                                        r"to the pad token, id 0, at 1 of 1 positions\)"):
        build_samples([{"q": "w3", "a": "w3"}, {"q": "3,5=", "a": "5"}], words, **BUILD, path="d.jsonl")
    with pytest.raises(DataError, match=r"^d\.jsonl:1: the prompt encodes to no tokens$"):
        build_samples([{"q": "", "a": "1"}], TOK, **BUILD, path="d.jsonl")


def test_metadata_forms() -> None:
    records = [{"q": "a", "a": "1", "metadata": '{"k": 1}'}, {"q": "b", "a": "1", "metadata": 5},
               {"q": "c", "a": "1"}]
    samples, _ = build_samples(records, TOK, **BUILD)
    assert [s.metadata for s in samples] == [{"k": 1}, {"value": 5}, {}]


# ---------------------------------------------------------------- data source


def test_data_source_groups_and_counters(tmp_path: Path) -> None:
    src = RolloutDataSourceWithBuffer(_args(_write_jsonl(tmp_path / "d.jsonl", ROWS)), tokenizer=TOK)
    assert len(src) == 7
    groups = src.get_samples(3)
    assert [len(g) for g in groups] == [2, 2, 2]
    assert [s.index for g in groups for s in g] == list(range(6))
    for g in groups:
        assert g[0].group_index == g[1].group_index and g[0].prompt == g[1].prompt
        assert g[0] is not g[1] and g[0].tokens is not g[1].tokens  # deep copies
    g = src.get_samples(1)[0]
    g[0].tokens.append(99)
    assert 99 not in src.prompts[g[0].group_index].tokens


def test_data_source_epochs_cover_every_prompt_once(tmp_path: Path) -> None:
    src = RolloutDataSourceWithBuffer(_args(_write_jsonl(tmp_path / "d.jsonl", ROWS)), tokenizer=TOK)
    groups = src.get_samples(21)  # three epochs
    epochs = [groups[i * 7 : (i + 1) * 7] for i in range(3)]
    for e, epoch in enumerate(epochs):
        assert sorted(g[0].group_index for g in epoch) == [e * 7 + i for i in range(7)]
        assert sorted(g[0].label for g in epoch) == sorted(r["a"] for r in ROWS)
    orders = [[g[0].label for g in epoch] for epoch in epochs]
    assert len({tuple(o) for o in orders}) == 3, "reshuffled every epoch"
    assert src.epoch == 2 and src.offset == 7


def test_data_source_shuffle_is_seeded(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)

    def order(**kw) -> list[str]:
        return [g[0].label for g in RolloutDataSourceWithBuffer(_args(path, **kw), tokenizer=TOK).get_samples(14)]

    assert order(rollout_seed=1) == order(rollout_seed=1)
    assert order(rollout_seed=1) != order(rollout_seed=2)
    assert order(rollout_shuffle=False) == [r["a"] for r in ROWS] * 2


def test_data_source_order_is_the_same_in_another_process(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    here = [g[0].group_index for g in RolloutDataSourceWithBuffer(_args(path), tokenizer=TOK).get_samples(10)]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from tests.test_data import _args, TOK; "
        "from pathlib import Path; from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer as D; "
        "print([g[0].group_index for g in D(_args(Path(sys.argv[2])), tokenizer=TOK).get_samples(10)])"
    )
    import subprocess

    env = dict(os.environ, PYTHONHASHSEED="123", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parents[1]), str(path)],
                         capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == str(here)


@pytest.mark.parametrize("with_buffer", [False, True])
def test_state_dict_resume_serves_identical_data(tmp_path: Path, with_buffer: bool) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    src = RolloutDataSourceWithBuffer(_args(path), tokenizer=TOK)
    first = src.get_samples(3)
    if with_buffer:
        first[1][0].response, first[1][0].abort_count = "partial", 1
        first[1][0].status = Sample.Status.ABORTED
        src.add_samples([first[1]])
    state = pickle.loads(pickle.dumps(src.state_dict()))
    json.dumps(state)  # plain data
    straight = _key(src.get_samples(9))  # crosses into epoch 1
    resumed = RolloutDataSourceWithBuffer(_args(path), tokenizer=TOK)
    resumed.load_state_dict(state)
    again = resumed.get_samples(9)
    assert _key(again) == straight
    if with_buffer:
        assert again[0][0].response == "partial" and again[0][0].status is Sample.Status.ABORTED
    assert resumed.state_dict() == src.state_dict()


def test_resume_with_a_different_dataset_is_refused(tmp_path: Path) -> None:
    src = RolloutDataSourceWithBuffer(_args(_write_jsonl(tmp_path / "d.jsonl", ROWS)), tokenizer=TOK)
    other = RolloutDataSourceWithBuffer(_args(_write_jsonl(tmp_path / "e.jsonl", ROWS[:5])), tokenizer=TOK)
    with pytest.raises(DataError, match="saved for 7 prompts but --prompt-data now has 5"):
        other.load_state_dict(src.state_dict())


def test_buffer_is_served_first_in_order(tmp_path: Path) -> None:
    src = RolloutDataSourceWithBuffer(_args(_write_jsonl(tmp_path / "d.jsonl", ROWS)), tokenizer=TOK)
    groups = src.get_samples(3)
    src.add_samples([groups[2]])
    src.add_samples([groups[0]])
    assert src.get_buffer_length() == 2
    first = src.get_samples(1)
    assert first[0] is groups[2]
    again = src.get_samples(2)
    assert again[0] is groups[0]
    assert [s.index for s in again[1]] == [6, 7]  # fresh prompts continue the counter
    assert src.get_buffer_length() == 0
    with pytest.raises(TypeError, match="list of groups"):
        src.add_samples(groups[0])  # a group, not a list of groups


def test_num_rollout_for_epochs(tmp_path: Path) -> None:
    src = RolloutDataSourceWithBuffer(_args(_write_jsonl(tmp_path / "d.jsonl", ROWS)), tokenizer=TOK)
    assert src.num_rollout_for_epochs(1, 7) == 1
    assert src.num_rollout_for_epochs(2, 3) == 5  # ceil(14 / 3)
    assert src.num_rollout_for_epochs(1, 100) == 1


def test_data_source_filters_and_keeps_record_ids(tmp_path: Path) -> None:
    rows = [{"q": "x" * n, "a": str(n)} for n in (3, 30, 4)]
    src = RolloutDataSourceWithBuffer(
        _args(_write_jsonl(tmp_path / "d.jsonl", rows), rollout_max_prompt_len=10, rollout_shuffle=False),
        tokenizer=TOK)
    assert len(src) == 2 and src.num_filtered == 1
    assert [g[0].group_index for g in src.get_samples(4)] == [0, 2, 3, 5]  # epoch * num_records + record


def test_data_source_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="^--prompt-data is required$"):
        RolloutDataSourceWithBuffer(_args(tmp_path / "x.jsonl", prompt_data=None), tokenizer=TOK)
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DataError, match="no prompts left"):
        RolloutDataSourceWithBuffer(_args(tmp_path / "e.jsonl"), tokenizer=TOK)
    with pytest.raises(DataError, match=r"d.jsonl:1: missing key 'q'"):
        RolloutDataSourceWithBuffer(_args(_write_jsonl(tmp_path / "d.jsonl", [{"input": "1"}])), tokenizer=TOK)


def test_data_source_default_tokenizer_and_custom_prompt_fn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "relax_test_prompt_fn.py").write_text(
        "def add_prefix(prompt, data):\n    return 'Q' + str(data['metadata']['i']) + ': ' + prompt\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    src = RolloutDataSourceWithBuffer(_args(path, rollout_shuffle=False,
                                            custom_prompt_path="relax_test_prompt_fn.add_prefix"))
    assert src.get_samples(1)[0][0].prompt == "Q0: 0+1="
