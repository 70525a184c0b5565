"""Videos as frame lists: fps sampling within the frame bounds, per-frame token budgets, Qwen2-VL's temporal
patches, and the same tokens and log-probs in the engine (``video_data``) and the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from relax.backends.embedded.engine import EmbeddedEngine
from relax.backends.torch.batch import TrainSample, build_model_inputs
from relax.backends.torch.logprobs import response_log_probs
from relax.core.train_data import _vision
from relax.data.dataset import DataError
from relax.data.media import encode_png
from relax.data.mm_pool import patch_images, patch_video
from relax.data.video_frames import sample_indices
from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
from relax.models import build_model, load_tokenizer
from relax.models.tokenizer import IMAGE_PAD_ID, VIDEO_PAD_ID
from tests.test_data import _args

TOK = load_tokenizer("tiny-qwen2.5-vl")


def test_frames_are_sampled_by_fps_within_the_bounds_and_rounded_to_the_frame_factor():
    kw = dict(min_frames=4, max_frames=768, factor=2)
    assert sample_indices(20, 10.0, target_fps=2.0, **kw) == [0, 6, 13, 19]  # 2 s at 2 fps = 4 frames
    assert len(sample_indices(20, 10.0, target_fps=4.0, **kw)) == 8
    assert len(sample_indices(20, 10.0, target_fps=0.5, **kw)) == 4  # 1 frame by fps, raised to min_frames
    assert len(sample_indices(20, 10.0, target_fps=10.0, min_frames=4, max_frames=6, factor=2)) == 6
    assert len(sample_indices(20, 10.0, target_fps=3.0, min_frames=4, max_frames=768, factor=4)) == 4  # 6 -> 4
    assert sample_indices(3, 1.0, target_fps=2.0, min_frames=4, max_frames=768, factor=4) == [0, 1, 2, 2]


def test_video_patches_pair_frames_per_token_in_qwen2_vl_layout():
    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)) for _ in range(4)]
    pixels, grid = patch_video(frames, 8, 2, 2)
    assert grid == [2, 4, 6] and pixels.shape == (2 * 24, 3 * 2 * 8 * 8)
    per_frame, _ = patch_images(frames, 8, 2, 2)  # each image patch holds its frame twice along time
    per_frame = per_frame.reshape(4, 24, 3, 2, 8, 8)
    tokens = pixels.reshape(2, 24, 3, 2, 8, 8)
    for g in range(2):
        for t in range(2):
            assert np.array_equal(tokens[g, :, :, t], per_frame[2 * g + t, :, :, 0])
    still, _ = patch_video([frames[0], frames[0]], 8, 2, 2)  # a still video is the image
    assert np.array_equal(still, patch_images([frames[0]], 8, 2, 2)[0])


def _clip(tmp_path: Path, n: int, size=(32, 32)) -> list[str]:
    names = []
    for i in range(n):
        Image.new("RGB", size, (10 * i, 100, 0)).save(tmp_path / f"f{i}.png")
        names.append(f"f{i}.png")
    return names


def _source(tmp_path: Path, rows: list[dict], **kw) -> RolloutDataSourceWithBuffer:
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = dict(hf_checkpoint="tiny-qwen2.5-vl", multimodal_keys={"image": "images", "video": "videos"},
                 apply_chat_template=True, rollout_shuffle=False, n_samples_per_prompt=1)
    return RolloutDataSourceWithBuffer(_args(path, **{**flags, **kw}), tokenizer=TOK)


def _video_row(tmp_path: Path, n: int = 10, fps: float = 5.0, size=(32, 32)) -> dict:
    return {"q": "<video>what happens?", "images": [], "videos": [{"frames": _clip(tmp_path, n, size), "fps": fps}],
            "a": "x"}


def test_a_video_row_becomes_video_pads_and_its_engine_fields(tmp_path):
    s = _source(tmp_path, [_video_row(tmp_path)]).get_samples(1)[0][0]  # 2 s at 2 fps: 4 frames, 2 temporal patches
    mm = s.multimodal_inputs
    # 32x32 frames hold 4 tokens, under the 128-token default minimum: scaled up to 192x192 (12 x 12 tokens)
    assert mm["video_grid_thw"] == [[2, 24, 24]] and s.tokens.count(VIDEO_PAD_ID) == 2 * 12 * 12
    assert mm["second_per_grid_ts"] == [pytest.approx(1.0)]  # 2 frames per patch at 2 fps
    assert len(mm["video_data"][0]["frames"]) == 4 and mm["video_data"][0]["fps"] == pytest.approx(2.0)
    assert s.tokens.count(IMAGE_PAD_ID) == 0


@pytest.mark.parametrize(("flags", "grid"), [
    ({"video_min_token_num": 1}, [2, 4, 4]),  # 32x32 kept: 4 tokens per frame
    ({"video_min_token_num": 1, "video_fps": 5.0}, [5, 4, 4]),  # every frame: 10 frames, 5 temporal patches
    ({"video_min_token_num": 1, "video_fps": 5.0, "video_fps_max_frames": 6}, [3, 4, 4]),
    ({"video_min_token_num": 1, "video_fps": 0.5, "video_fps_min_frames": 8}, [4, 4, 4]),
    ({"video_min_token_num": 1, "video_fps": 3.0, "frame_factor": 4}, [2, 4, 4]),  # 6 frames -> 4
    ({"video_min_token_num": 1, "video_max_token_num": 1}, [2, 2, 2]),  # 64x64 frames at most 1 token each
])
def test_the_video_flags_shape_the_video_tokens(tmp_path, flags, grid):
    size = (64, 64) if flags.get("video_max_token_num") == 1 else (32, 32)
    s = _source(tmp_path, [_video_row(tmp_path, size=size)], **flags).get_samples(1)[0][0]
    assert s.multimodal_inputs["video_grid_thw"] == [grid]
    assert s.tokens.count(VIDEO_PAD_ID) == grid[0] * grid[1] * grid[2] // 4


def test_a_video_file_is_refused_naming_the_row_and_what_to_install(tmp_path):
    row = {"q": "<video>?", "images": [], "videos": ["clip.mp4"], "a": "x"}
    with pytest.raises(DataError) as err:
        _source(tmp_path, [row])
    assert str(err.value) == ("v.jsonl:1: video 0: video clip.mp4 is a video file; decoding one needs av or decord "
                              "(pip install av), not installed here: give the video as a list of frame images"
                              ).replace("v.jsonl", str(tmp_path / "v.jsonl"))


def test_engine_and_trainer_agree_on_a_video_and_an_image_prompt(tmp_path):
    model = build_model("tiny-qwen2.5-vl", seed=2)
    rows = [_video_row(tmp_path), {"q": "<image> then <video>", "images": [_clip(tmp_path, 1)[0]],
                                   "videos": [_clip(tmp_path, 3)], "a": "y"}]
    samples = [g[0] for g in _source(tmp_path, rows, video_min_token_num=1).get_samples(2)]
    engine = EmbeddedEngine(model, eos_token_ids=[2], tokenizer=TOK)
    requests = []
    for i, s in enumerate(samples):
        req = {"input_ids": s.tokens, "return_logprob": True,
               "sampling_params": {"max_new_tokens": 3, "temperature": 1.0, "sampling_seed": i}}
        req.update({k: s.multimodal_inputs[k] for k in ("image_data", "video_data") if s.multimodal_inputs.get(k)})
        requests.append(req)
    answers = engine.generate(requests)
    train = [TrainSample(tokens=s.tokens + a["output_ids"], response_length=len(a["output_ids"]),
                         loss_mask=[1] * len(a["output_ids"]), reward=0.0, vision=_vision(s))
             for s, a in zip(samples, answers, strict=True)]
    lp, _ = response_log_probs(model, build_model_inputs(train, 3, 0, "cpu"), temperature=1.0, with_entropy=False)
    for i, a in enumerate(answers):
        engine_lp = [e[0] for e in a["meta_info"]["output_token_logprobs"]]
        assert lp[i, :len(engine_lp)].tolist() == pytest.approx(engine_lp, abs=1e-5)
    # the frames matter: other frames, same tokens, other log-probs
    dark = {"frames": [encode_png(Image.new("RGB", (32, 32)))] * 4, "fps": 2.0}
    again = engine.generate([dict(requests[0], video_data=[dark])])[0]
    assert again["meta_info"]["output_token_logprobs"][0][0] != pytest.approx(
        answers[0]["meta_info"]["output_token_logprobs"][0][0], abs=1e-6)


def test_a_seed_001_row_with_image_video_and_audio_columns(tmp_path):
    """Seed 001's VLM example: the image and video columns load; an <audio> a vision-language model cannot hear is
    refused in one line rather than left in the prompt as text (tests/test_multimodal_audio.py: the omni model
    hears it)."""
    Image.new("RGB", (32, 32), (0, 0, 200)).save(tmp_path / "img.png")
    row = {"q": [{"role": "user", "content": "<image><video>Which colour? <answer>A</answer> or B"}],
           "images": ["img.png"], "videos": [_clip(tmp_path, 4)], "audios": ["a.wav"], "a": "<answer>B</answer>"}
    s = _source(tmp_path, [row], video_min_token_num=1).get_samples(1)[0][0]
    assert s.tokens.count(IMAGE_PAD_ID) == 4 and s.tokens.count(VIDEO_PAD_ID) == 2 * 4
    assert "<image>" not in s.prompt and "<video>" not in s.prompt
    row["q"][0]["content"] += " <audio>"
    with pytest.raises(DataError, match=r"v.jsonl:1: the prompt has 1 <audio> placeholder\(s\) but --multimodal-keys "
                                        r"names no audio column"):
        _source(tmp_path, [row], video_min_token_num=1)
    with pytest.raises(DataError, match=r"--multimodal-keys audio and --use-audio-in-video need a model with an audio "
                                        r"tower \(e\.g\. --hf-checkpoint tiny-qwen2.5-omni\)"):
        _source(tmp_path, [row], multimodal_keys={"image": "images", "video": "videos", "audio": "audios"})
    with pytest.raises(DataError, match=r"v.jsonl:1: the prompt has 1 <video> placeholder\(s\) but --multimodal-keys "
                                        r"names no video column"):
        _source(tmp_path, [row], multimodal_keys={"image": "images"})
