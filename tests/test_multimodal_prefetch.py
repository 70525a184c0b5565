"""The streaming prefetch cache: it runs ahead within its flags, and changes neither the samples nor a resume."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from relax.data.dataset import DataError
from relax.data.prefetch import prefetch_problems
from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
from relax.models import load_tokenizer
from tests.test_data import _args

TOK = load_tokenizer("tiny-qwen2.5-vl")


def _data(tmp_path: Path, n: int = 12) -> Path:
    rows = []
    for i in range(n):
        Image.new("RGB", (16 + 16 * (i % 3), 32), (i * 20, 0, 0)).save(tmp_path / f"{i}.png")
        rows.append({"q": f"<image>{i}?", "images": [f"{i}.png"], "a": str(i)})
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _source(path: Path, **kw) -> RolloutDataSourceWithBuffer:
    flags = dict(hf_checkpoint="tiny-qwen2.5-vl", multimodal_keys={"image": "images"}, use_streaming_dataset=True,
                 streaming_buffer_size=4, n_samples_per_prompt=1)
    return RolloutDataSourceWithBuffer(_args(path, **{**flags, **kw}), tokenizer=TOK)


def _settle(src: RolloutDataSourceWithBuffer, cached: int) -> None:
    deadline = time.monotonic() + 10
    while src.prefetch.cached < cached and time.monotonic() < deadline:
        time.sleep(0.01)


def _key(groups) -> list:
    return [(g[0].label, tuple(g[0].tokens), g[0].multimodal_inputs["image_grid_thw"][0][2]) for g in groups]


def test_the_cache_runs_ahead_in_rounds_of_the_chunk_size_up_to_max_cached(tmp_path):
    src = _source(_data(tmp_path), prefetch_chunk_size=2, prefetch_max_cached=5)
    _settle(src, 5)
    time.sleep(0.05)
    assert src.prefetch.cached == 5 and src.prefetch.rounds == [2, 2, 1]  # full: the thread waits
    src.get_samples(3)
    _settle(src, 5)
    time.sleep(0.05)
    # refilled as room frees (a round per freed slot or two, as the thread wakes), never past the cap
    assert src.prefetch.cached == 5 and sum(src.prefetch.rounds) == 8 and max(src.prefetch.rounds) == 2


def test_max_cached_zero_turns_prefetching_off(tmp_path):
    assert _source(_data(tmp_path), prefetch_max_cached=0).prefetch is None
    assert _source(_data(tmp_path), multimodal_keys=None, q="a").prefetch is None  # text rows: nothing to decode


def test_prefetched_samples_equal_the_unprefetched_ones_across_epochs(tmp_path):
    path = _data(tmp_path)
    plain = _source(path, prefetch_max_cached=0).get_samples(30)
    cached = _source(path, prefetch_chunk_size=3, prefetch_max_cached=7).get_samples(30)
    assert _key(plain) == _key(cached)


def test_num_workers_threads_prepare_the_images(tmp_path):
    src = _source(_data(tmp_path), prefetch_num_workers=3, prefetch_max_cached=12, prefetch_chunk_size=12)
    seen: set[str] = set()
    original = src.builder.media.prepare

    def spy(record, where):
        seen.add(threading.current_thread().name)
        time.sleep(0.02)
        return original(record, where)

    src.builder.media.prepare = spy
    src.prefetch.load_state_dict(src.prefetch.state_dict())  # restart the thread with the spy in place
    src.get_samples(12)
    assert len(seen) == 3 and all(name.startswith("relax-prefetch") for name in seen)


def test_a_resume_restarts_at_the_rollouts_position_not_the_threads(tmp_path):
    path = _data(tmp_path)
    first = _source(path, prefetch_chunk_size=3, prefetch_max_cached=6)
    first.get_samples(4)
    _settle(first, 6)
    state = json.loads(json.dumps(first.state_dict()))  # plain data
    rest = _key(first.get_samples(10))
    resumed = _source(path, prefetch_chunk_size=3, prefetch_max_cached=6)
    resumed.load_state_dict(state)
    assert _key(resumed.get_samples(10)) == rest
    unprefetched = _source(path, prefetch_max_cached=0)
    unprefetched.load_state_dict(state)
    assert _key(unprefetched.get_samples(10)) == rest


def test_a_bad_image_met_by_the_prefetch_thread_fails_in_the_rollout_naming_the_row(tmp_path):
    path = _data(tmp_path, n=3)
    (tmp_path / "1.png").unlink()
    src = _source(path, rollout_shuffle=False)
    with pytest.raises(DataError, match=r"d.jsonl:2: image 0: image file not found: .*1.png"):
        src.get_samples(3)


def test_bad_prefetch_values_are_one_line_each():
    assert prefetch_problems(chunk_size=0, max_cached=-1, num_workers=0) == [
        "--prefetch-chunk-size 0 must be >= 1", "--prefetch-max-cached -1 must be >= 0 (0: no prefetching)",
        "--prefetch-num-workers 0 must be >= 1"]
