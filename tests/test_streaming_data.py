"""--use-streaming-dataset (relax/data/streaming.py) and --custom-prompt-path: the streaming source serves the
in-memory source's samples, shuffles deterministically through its buffer, resumes at the exact next prompt, and
names the file and row of a bad record, or the hook that raised."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from relax.data.dataset import DataError
from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
from relax.utils.plugins import PluginError
from tests.test_data import TOK, _args, _key, _write_jsonl

ROWS = [{"q": f"{i}+1=", "a": str(i + 1), "metadata": {"i": i}} for i in range(23)]


def _parquet(path: Path, rows: list[dict], row_group_size: int = 5) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def _files(tmp_path: Path) -> str:
    """Two files read in order: 10 rows of jsonl (a blank line among them), then 13 of parquet in row groups of 5."""
    j = tmp_path / "a.jsonl"
    _write_jsonl(j, ROWS[:10])
    j.write_text(j.read_text().replace("\n", "\n\n", 1))
    return str([str(j), str(_parquet(tmp_path / "b.parquet", ROWS[10:]))])


def _source(prompt_data: str, **kw) -> RolloutDataSourceWithBuffer:
    return RolloutDataSourceWithBuffer(_args(Path("."), prompt_data=prompt_data, **kw), tokenizer=TOK)


def _draw(src: RolloutDataSourceWithBuffer, calls: int, groups: int = 3) -> list:
    return [_key(src.get_samples(groups)) for _ in range(calls)]


def test_without_shuffle_streaming_serves_the_in_memory_samples(tmp_path: Path) -> None:
    data = _files(tmp_path)
    kw = dict(rollout_shuffle=False, rollout_max_prompt_len=4)  # "10+1=" and up are 5 tokens: dropped alike
    memory, streaming = _source(data, **kw), _source(data, use_streaming_dataset=True, **kw)
    assert _draw(streaming, 12) == _draw(memory, 12)  # 36 groups: four epochs of the 9 kept prompts
    assert len(streaming) == 23 and streaming.num_filtered > 0


def test_shuffle_buffer_is_seeded_and_serves_each_record_once_an_epoch(tmp_path: Path) -> None:
    data = _files(tmp_path)
    a = _source(data, use_streaming_dataset=True, streaming_buffer_size=4)
    b = _source(data, use_streaming_dataset=True, streaming_buffer_size=4)
    draws = [g[0][0][0] for g in _draw(a, 23, groups=1)]
    draws += [g[0][0][0] for g in _draw(a, 23, groups=1)]  # two epochs of 23 records
    assert draws[:23] == [g[0][0][0] for g in _draw(b, 23, groups=1)]
    for epoch in (0, 1):
        indices = sorted(d - epoch * 23 for d in draws[epoch * 23:(epoch + 1) * 23])
        assert indices == list(range(23))
    assert draws[:23] != sorted(draws[:23])  # shuffled
    assert draws[:23] != [d - 23 for d in draws[23:]]  # each epoch its own order (seed + epoch)
    other = _source(data, use_streaming_dataset=True, streaming_buffer_size=4, rollout_seed=6)
    assert [g[0][0][0] for g in _draw(other, 10, groups=1)] != draws[:10]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("first_calls", [1, 4, 9])  # mid-file, in the second file, in the second epoch
def test_resume_continues_from_the_exact_sample(tmp_path: Path, shuffle: bool, first_calls: int) -> None:
    data = _files(tmp_path)
    kw = dict(use_streaming_dataset=True, streaming_buffer_size=6, rollout_shuffle=shuffle)
    straight = _draw(_source(data, **kw), 14)
    first = _source(data, **kw)
    head = _draw(first, first_calls)
    first.add_samples(first.get_samples(1))  # a recycled group rides along in the state
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = _source(data, **kw)
    resumed.load_state_dict(state)
    assert resumed.get_buffer_length() == 1
    tail = _draw(resumed, 14 - first_calls)  # the recycled group first, then the prompts after it
    assert head + tail == straight
    with pytest.raises(DataError, match="saved with --use-streaming-dataset; resume with the same setting"):
        _source(data, rollout_shuffle=shuffle).load_state_dict(state)


def test_bad_rows_and_files_name_the_file_and_row(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "1", "a": "1"}\n\n{not json\n')
    src = _source(str(bad), use_streaming_dataset=True, rollout_shuffle=False)
    src.get_samples(1)
    with pytest.raises(DataError, match=r"^.*bad.jsonl:3: invalid JSON"):
        src.get_samples(1)
    keyless = _write_jsonl(tmp_path / "k.jsonl", [{"q": "1", "a": "1"}, {"q": "2", "a": "2"}, {"x": "3", "a": "3"}])
    src = _source(str(keyless), use_streaming_dataset=True, rollout_shuffle=False)
    with pytest.raises(DataError, match=r"k.jsonl:3: missing key 'q' \(the record has keys: x, a\)"):
        src.get_samples(3)
    torn = _parquet(tmp_path / "t.parquet", ROWS, 5)
    body = bytearray(torn.read_bytes())
    body[4:120] = b"\xff" * 116  # row group 0's pages overwritten, the footer intact
    torn.write_bytes(bytes(body))
    src = _source(str(torn), use_streaming_dataset=True, rollout_shuffle=False)
    with pytest.raises(DataError, match=r"t.parquet:1: cannot read parquet row group 0"):
        src.get_samples(3)
    garbage = tmp_path / "g.parquet"
    garbage.write_bytes(b"not a parquet file at all")
    with pytest.raises(DataError, match=r"g.parquet: cannot read parquet"):
        _source(str(garbage), use_streaming_dataset=True)
    with pytest.raises(DataError, match=r"prompt data not found: .*nope.jsonl"):
        _source(str(tmp_path / "nope.jsonl"), use_streaming_dataset=True)
    with pytest.raises(DataError, match=r"prompt data .* is a directory; give a .jsonl or .parquet file"):
        _source(str(tmp_path), use_streaming_dataset=True)
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no prompts left"):
        _source(str(tmp_path / "e.jsonl"), use_streaming_dataset=True)
    with pytest.raises(DataError, match="no prompts left"):
        _source(str(_write_jsonl(tmp_path / "d.jsonl", ROWS[10:14])), use_streaming_dataset=True,
                rollout_max_prompt_len=4).get_samples(1)


@pytest.mark.parametrize("streaming", [False, True])
def test_custom_prompt_hook_both_loaders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streaming: bool) -> None:
    (tmp_path / "relax_test_stream_hooks.py").write_text(
        "def shout(prompt, data):\n    return prompt + '!' * (data['metadata']['i'] + 1)\n"
        "def boom(prompt, data):\n    if data['metadata']['i'] == 2:\n        raise KeyError('nope')\n    return prompt\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = str(_parquet(tmp_path / "d.parquet", ROWS[:6], 4))
    kw = dict(use_streaming_dataset=streaming, rollout_shuffle=False)
    src = _source(data, custom_prompt_path="relax_test_stream_hooks.shout", **kw)
    assert [g[0].prompt for g in src.get_samples(3)] == ["0+1=!", "1+1=!!", "2+1=!!!"]
    with pytest.raises(PluginError, match=r"^--custom-prompt-path: cannot import module 'relax_test_nohook'"):
        _source(data, custom_prompt_path="relax_test_nohook.fn", **kw)
    with pytest.raises(PluginError, match=r"d.parquet:3: --custom-prompt-path relax_test_stream_hooks.boom raised "
                                          r"KeyError: 'nope'; expected custom_fn\(prompt, data: dict\) -> prompt"):
        _source(data, custom_prompt_path="relax_test_stream_hooks.boom", **kw).get_samples(3)
