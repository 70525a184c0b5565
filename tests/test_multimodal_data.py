"""Multimodal rows (images): media values, the token budget flags, placeholders, the pools, jsonl and parquet."""

from __future__ import annotations

import base64
import json
import os
from argparse import Namespace
from pathlib import Path

import pytest
from PIL import Image

from relax.data.dataset import DataError
from relax.data.image_budget import smart_resize
from relax.data.media import encode_png, load_image
from relax.data.mm_config import MultimodalConfig, multimodal_problems
from relax.data.mm_pool import ImageSpec, prepare_images
from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
from relax.models import build_config, load_tokenizer
from relax.models.tokenizer import IMAGE_PAD_ID
from tests.test_data import _args

VLM = "tiny-qwen2.5-vl"
TOK = load_tokenizer(VLM)


def _png(tmp_path: Path, name: str, size: tuple[int, int], colour=(200, 10, 10)) -> Path:
    path = tmp_path / name
    Image.new("RGB", size, colour).save(path)
    return path


def _spec(**kw) -> ImageSpec:
    base = dict(patch_size=8, merge_size=2, temporal_patch_size=2, factor=16, align=16, min_tokens=4,
                max_tokens=16384, base_dir=None)
    return ImageSpec(**{**base, **kw})


# ---------------------------------------------------------------- media values
def test_an_image_loads_from_a_path_bytes_base64_a_data_uri_and_a_parquet_struct(tmp_path):
    path = _png(tmp_path, "a.png", (20, 10))
    raw = path.read_bytes()
    for value in (str(path), "a.png", raw, base64.b64encode(raw).decode(), encode_png(Image.open(path)),
                  {"bytes": raw, "path": None}, {"bytes": None, "path": str(path)}):
        img = load_image(value, "d.jsonl:1", base_dir=tmp_path)
        assert img.size == (20, 10) and img.mode == "RGB" and img.getpixel((0, 0)) == (200, 10, 10)


@pytest.mark.parametrize(("value", "expected"), [
    ("https://example.com/cat.png", "d.jsonl:3: image URL https://example.com/cat.png cannot be fetched: runs are "
                                    "offline"),
    ("missing.png", "d.jsonl:3: image file not found:"),
    (b"not an image", "d.jsonl:3: the image bytes is not an image PIL can read"),
    (12, "d.jsonl:3: an image must be a path, a URL, base64 text or bytes, got int"),
])
def test_a_bad_image_value_is_one_line_naming_the_row(tmp_path, value, expected):
    with pytest.raises(DataError) as err:
        load_image(value, "d.jsonl:3", base_dir=tmp_path)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


# ---------------------------------------------------------------- budgets
def test_smart_resize_keeps_the_token_budget_and_the_alignment():
    assert smart_resize(32, 32, factor=16, align=16, min_tokens=4, max_tokens=100) == (32, 32)
    h, w = smart_resize(640, 320, factor=16, align=16, min_tokens=4, max_tokens=8)  # scaled down to <= 8 tokens
    assert (h // 16) * (w // 16) <= 8 and h % 16 == 0 and w % 16 == 0 and h == 2 * w
    h, w = smart_resize(10, 10, factor=16, align=16, min_tokens=9, max_tokens=100)  # scaled up to >= 9 tokens
    assert (h, w) == (48, 48)
    assert smart_resize(50, 90, factor=28, align=28, min_tokens=1, max_tokens=100) == (56, 84)
    assert smart_resize(50, 70, factor=28, align=1, min_tokens=1, max_tokens=100) == (50, 70)  # factor 0: unaligned


def test_image_token_flags_change_the_image_tokens(tmp_path):
    path = str(_png(tmp_path, "big.png", (256, 128)))
    tokens = {}
    for name, spec in {"default": _spec(), "max 8": _spec(max_tokens=8), "min 400": _spec(min_tokens=400),
                       "factor 32": _spec(factor=32, align=32, max_tokens=16)}.items():
        prepared = prepare_images([path], "d.jsonl:1", spec)
        tokens[name] = prepared.pad_counts[0]
        t, h, w = prepared.image_grid_thw[0]
        assert prepared.pixel_values.shape == (t * h * w, 3 * 2 * 8 * 8)
    # min 400: scaled up to 464x240 (29 x 15 tokens); factor 32, at most 16 of its 32px tokens: 160x64, which the
    # tiny VLM's 16px tokens count as 10 x 4
    assert tokens == {"default": 128, "max 8": 8, "min 400": 435, "factor 32": 40}


def test_multimodal_flag_values_are_checked_one_line_each():
    ns = Namespace(multimodal_keys={"image": "img", "audio": "a", "smell": "s"}, image_min_token_num=10,
                   image_max_token_num=5, image_resize_scale_factor=-1, mm_processor_pool_size=-2,
                   video_min_token_num=0, video_max_token_num=None, video_fps=0.0, video_fps_min_frames=9,
                   video_fps_max_frames=8, frame_factor=None, audio_sample_rate=500)
    assert multimodal_problems(ns) == [
        "--multimodal-keys: unknown modality 'smell' (known: image, video, audio)",
        "--image-min-token-num 10 exceeds --image-max-token-num 5",
        "--image-resize-scale-factor -1 must be >= 0 (0: no alignment)",
        "--video-min-token-num 0 must be >= 1",
        "--video-fps 0.0 must be > 0",
        "--video-fps-min-frames 9 exceeds --video-fps-max-frames 8",
        "--audio-sample-rate 500 must be >= 1000 Hz (the feature extractor's 400-sample window and 160-sample hop "
        "are fixed)",
        "--mm-processor-pool-size -2 must be >= 0 (0: a thread pool)",
    ]


# ---------------------------------------------------------------- rows -> samples
def _rows(tmp_path: Path) -> list[dict]:
    img = _png(tmp_path, "red.png", (32, 32))
    return [
        {"q": [{"role": "user", "content": "<image>what colour?"}], "images": ["red.png"], "a": "r"},
        {"q": "<image> and <image>?", "images": [str(img), encode_png(Image.new("RGB", (64, 32)))], "a": "b"},
    ]


def _mm(tmp_path: Path, rows: list[dict], suffix: str = ".jsonl", **kw) -> RolloutDataSourceWithBuffer:
    path = tmp_path / f"d{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([dict(r, q=json.dumps(r["q"]) if not isinstance(r["q"], str) else r["q"])
                                             for r in rows]), path)
    flags = dict(hf_checkpoint=VLM, multimodal_keys={"image": "images"}, apply_chat_template=True,
                 rollout_shuffle=False, n_samples_per_prompt=1)
    return RolloutDataSourceWithBuffer(_args(path, **{**flags, **kw}), tokenizer=TOK)


def test_placeholders_become_one_pad_per_merged_patch_and_the_engine_fields(tmp_path):
    src = _mm(tmp_path, _rows(tmp_path))
    first, second = (g[0] for g in src.get_samples(2))
    assert first.tokens.count(IMAGE_PAD_ID) == 4 and second.tokens.count(IMAGE_PAD_ID) == 4 + 8
    assert first.prompt.startswith("<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>")
    assert second.multimodal_inputs["image_grid_thw"] == [[1, 4, 4], [1, 4, 8]]
    assert second.multimodal_inputs["pixel_values"].shape == (16 + 32, 384)
    assert all(u.startswith("data:image/png;base64,") for u in second.multimodal_inputs["image_data"])


def test_the_image_budget_flags_reach_the_samples(tmp_path):
    small = _mm(tmp_path, _rows(tmp_path), image_max_token_num=2, image_min_token_num=1).get_samples(2)
    # per image: 32x32 -> 16x16 (1 token); 64x32 -> 32x16 (2 tokens)
    assert [g[0].tokens.count(IMAGE_PAD_ID) for g in small] == [1, 1 + 2]
    scaled = _mm(tmp_path, _rows(tmp_path), image_resize_scale_factor=32).get_samples(1)[0][0]
    # 32x32 is one 32px token, under the 4-token minimum: scaled up to 64x64, 8 x 8 patches, 16 tokens of 16px
    assert scaled.multimodal_inputs["image_grid_thw"] == [[1, 8, 8]] and scaled.tokens.count(IMAGE_PAD_ID) == 16


def test_a_parquet_file_with_image_bytes_loads_like_jsonl(tmp_path):
    rows = _rows(tmp_path)
    rows[0]["q"] = "<image>what colour?"
    jsonl = [g[0].tokens for g in _mm(tmp_path, rows).get_samples(2)]
    rows[0]["images"] = [{"bytes": (tmp_path / "red.png").read_bytes(), "path": None}]  # HF datasets' image struct
    rows[1]["images"] = [{"bytes": None, "path": v} for v in rows[1]["images"]]
    parquet = [g[0].tokens for g in _mm(tmp_path, rows, suffix=".parquet").get_samples(2)]
    assert jsonl == parquet and jsonl[0].count(IMAGE_PAD_ID) == 4


def test_a_process_pool_gives_the_same_samples_as_the_thread_pool(tmp_path):
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    threads, processes = _mm(tmp_path, _rows(tmp_path)), _mm(tmp_path, _rows(tmp_path), mm_processor_pool_size=1)
    assert isinstance(threads.builder.media.pool, ThreadPoolExecutor)
    assert isinstance(processes.builder.media.pool, ProcessPoolExecutor)
    worker_pids = {p for p in processes.builder.media.pool._processes}
    assert worker_pids and os.getpid() not in worker_pids  # the images were prepared in another process
    a, b = threads.get_samples(2), processes.get_samples(2)
    assert [g[0].tokens for g in a] == [g[0].tokens for g in b]
    assert (a[1][0].multimodal_inputs["pixel_values"] == b[1][0].multimodal_inputs["pixel_values"]).all()
    processes.builder.media.close()


@pytest.mark.parametrize(("change", "expected"), [
    ({"images": ["red.png", "red.png"]}, "d.jsonl:1: 2 image(s) in column 'images' but 1 <image> placeholder(s)"),
    ({"images": ["nope.png"]}, "d.jsonl:1: image 0: image file not found:"),
    ({"images": ["http://host/x.png"]}, "d.jsonl:1: image 0: image URL http://host/x.png cannot be fetched"),
])
def test_a_bad_row_fails_in_one_line_naming_file_and_line(tmp_path, change, expected):
    rows = _rows(tmp_path)
    rows[0].update(change)
    with pytest.raises(DataError) as err:
        _mm(tmp_path, rows)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_missing_image_column_and_a_text_model_are_refused(tmp_path):
    rows = _rows(tmp_path)
    del rows[1]["images"]
    with pytest.raises(DataError, match=r"d.jsonl:2: missing key 'images' .*\(--multimodal-keys image\)"):
        _mm(tmp_path, rows)
    with pytest.raises(DataError, match="--multimodal-keys needs a vision-language --hf-checkpoint; tiny-qwen3"):
        _mm(tmp_path, _rows(tmp_path), hf_checkpoint="tiny-qwen3")


def test_streaming_rows_prepare_their_images_as_they_are_drawn(tmp_path):
    memory = [g[0].tokens for g in _mm(tmp_path, _rows(tmp_path)).get_samples(2)]
    streamed = _mm(tmp_path, _rows(tmp_path), use_streaming_dataset=True).get_samples(2)
    assert [g[0].tokens for g in streamed] == memory
    assert streamed[1][0].multimodal_inputs["image_grid_thw"] == [[1, 4, 4], [1, 4, 8]]


def test_the_config_slice_resolves_the_seed_defaults():
    cfg = MultimodalConfig({"image": "i"}, None, None, None, 0)
    assert (cfg.enabled, cfg.min_tokens, cfg.max_tokens) == (True, 4, 16384)
    assert build_config(VLM).vision_config.patch_size * build_config(VLM).vision_config.spatial_merge_size == 16




def test_a_multimodal_sample_round_trips_through_plain_data(tmp_path):
    from relax.utils.types import Sample

    s = _mm(tmp_path, _rows(tmp_path)).get_samples(2)[1][0]
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert (back.multimodal_inputs["pixel_values"] == s.multimodal_inputs["pixel_values"]).all()
    assert back.multimodal_inputs["pixel_values"].dtype == s.multimodal_inputs["pixel_values"].dtype
    assert back.multimodal_inputs["image_data"] == s.multimodal_inputs["image_data"] and back.tokens == s.tokens


def test_process_pool_workers_leave_when_their_parent_dies(tmp_path):
    """A parent killed without shutting its pool down (as Ray kills an actor) leaves no worker behind."""
    import subprocess
    import sys
    import time

    script = ("import os, sys\n"
              "from relax.data.mm_pool import make_pool\n"
              "pool = make_pool(1)\n"
              "pool.submit(os.getpid).result()\n"
              "print(*pool._processes, flush=True)\n"
              "os._exit(0)\n")
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=repo)
    workers = [int(p) for p in out.stdout.split()]
    assert workers, out.stderr
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in workers if Path(f"/proc/{p}").exists()]
    for pid in left:  # leave no orphan behind when the check fails
        os.kill(pid, 9)
    assert not left
