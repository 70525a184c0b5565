"""Audio on the tiny Qwen2.5-Omni thinker: clips in every row form, resampled to --audio-sample-rate, <audio> and
--use-audio-in-video laid out as Qwen2_5OmniProcessor lays them out, SGLang's audio_data in the embedded engine, the
same tokens and log-probs on both sides, and the audio tower trained or frozen and synced."""

from __future__ import annotations

import base64
import json
import types
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from relax.backends.config import TrainerConfig
from relax.backends.embedded.engine import EmbeddedEngine
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import TrainSample, build_model_inputs
from relax.backends.torch.logprobs import response_log_probs
from relax.core.train_data import _vision
from relax.data.audio import encode_wav, load_audio, log_mel, resample
from relax.data.dataset import DataError
from relax.data.multimodal import interleave_video_audio, media_request_fields
from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
from relax.models import build_model, load_tokenizer
from relax.models.checkpoint_names import checkpoint_name
from relax.models.omni import audio_token_count
from relax.models.tokenizer import AUDIO_END_ID, AUDIO_PAD_ID, AUDIO_START_ID, IMAGE_PAD_ID, VIDEO_PAD_ID
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from tests.test_data import _args

OMNI = "tiny-qwen2.5-omni"
TOK = load_tokenizer(OMNI)
KEYS = {"image": "images", "video": "videos", "audio": "audios"}
AV = {"video": "videos", "audio": "audios"}


def _tone(freq: float, rate: int = 22050, seconds: float = 1.0, channels: int = 1, width: int = 2) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    x = np.repeat(0.5 * np.sin(2 * np.pi * freq * t)[:, None], channels, axis=1)
    if width == 1:
        raw = np.round(x * 127 + 128).astype(np.uint8).tobytes()
    elif width == 3:
        v = np.round(x * 8388607).astype("<i4").reshape(-1)
        raw = np.stack([v & 0xFF, v >> 8 & 0xFF, v >> 16 & 0xFF], axis=1).astype(np.uint8).tobytes()
    else:
        raw = np.round(x * 32767).astype("<i2").tobytes()
    buf = __import__("io").BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return buf.getvalue()


def _frames(tmp_path: Path, n: int = 4) -> list[str]:
    for i in range(n):
        Image.new("RGB", (32, 32), (60 * i, 100, 0)).save(tmp_path / f"f{i}.png")
    return [f"f{i}.png" for i in range(n)]


def _source(tmp_path: Path, rows: list[dict], **kw) -> RolloutDataSourceWithBuffer:
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = dict(hf_checkpoint=OMNI, multimodal_keys={"audio": "audios"}, apply_chat_template=True, rollout_shuffle=False,
                 n_samples_per_prompt=1, video_min_token_num=1)
    return RolloutDataSourceWithBuffer(_args(path, **{**flags, **kw}), tokenizer=TOK)


def _sample(tmp_path: Path, row: dict, **kw):
    return _source(tmp_path, [row], **kw).get_samples(1)[0][0]


# ---------------------------------------------------------------- clips
def test_a_clip_loads_from_every_row_form_alike(tmp_path):
    data = _tone(440)
    (tmp_path / "a.wav").write_bytes(data)
    ref, rate = load_audio(str(tmp_path / "a.wav"), "r")
    assert rate == 22050 and len(ref) == 22050
    b64 = base64.b64encode(data).decode()
    for value in ("a.wav", "data:audio/wav;base64," + b64, b64, data, {"bytes": data, "path": None},
                  {"bytes": None, "path": "a.wav"}, {"array": ref.tolist(), "sampling_rate": 22050}):
        x, r = load_audio(value, "r", tmp_path)
        assert r == 22050 and np.array_equal(x, ref)
    stereo, _ = load_audio(_tone(440, channels=2), "r")  # channels averaged to mono
    assert np.allclose(stereo, ref)
    for width in (1, 3):  # 8- and 24-bit PCM
        x, _ = load_audio(_tone(440, width=width), "r")
        assert np.abs(x - ref).max() < 1e-2


@pytest.mark.parametrize(("value", "expected"), [
    ("https://host/a.wav", "a.jsonl:1: audio 0: audio URL https://host/a.wav cannot be fetched: runs are offline"),
    ("missing.wav", "a.jsonl:1: audio 0: audio file not found: "),
    ("data:audio/mpeg;base64," + base64.b64encode(b"ID3" + bytes(80)).decode(),
     "a.jsonl:1: audio 0: the base64 audio is mp3 audio; only WAV (PCM) is decoded here"),
    ({"bytes": base64.b64encode(b"RIFF" + bytes(60)).decode(), "path": None},
     "a.jsonl:1: audio 0: the audio struct's bytes is not a PCM WAV file the wave module can read"),
    ({"bytes": "not base64", "path": None}, "a.jsonl:1: audio 0: the audio struct's bytes are text but not base64"),
    ({"array": [0.0] * 100, "sampling_rate": 16000},
     "a.jsonl:1: audio 0: audio of 100 samples at 16000 Hz is shorter than one 400-sample window"),
    ({"array": [0.1, 0.2], "sampling_rate": "fast"}, "a.jsonl:1: audio 0: an audio array needs a positive integer"),
    (7, "a.jsonl:1: audio 0: an audio clip must be a WAV path, base64 text, bytes or"),
])
def test_a_bad_clip_is_refused_in_one_line_naming_its_row_and_column(tmp_path, value, expected):
    row = {"q": "<audio>hi", "audios": [value], "a": "x"}
    with pytest.raises(DataError) as err:
        _source(tmp_path, [row])
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_resampler_keeps_the_band_and_drops_what_the_new_rate_cannot_hold():
    for orig, new, freq in ((16000, 8000, 440), (8000, 16000, 440), (44100, 16000, 1000), (22050, 16000, 3000)):
        x = np.sin(2 * np.pi * freq * np.arange(orig) / orig).astype(np.float32)
        y = resample(x, orig, new)
        assert len(y) == new
        ref = np.sin(2 * np.pi * freq * np.arange(new) / new)
        assert np.abs(y[new // 4:3 * new // 4] - ref[new // 4:3 * new // 4]).max() < 2e-3
    alias = np.sin(2 * np.pi * 6000 * np.arange(16000) / 16000).astype(np.float32)  # above 8 kHz's Nyquist
    assert np.abs(resample(alias, 16000, 8000)[500:-500]).max() < 5e-3
    assert resample(alias, 16000, 16000) is not None and np.array_equal(resample(alias, 16000, 16000), alias)


# ---------------------------------------------------------------- rows -> tokens
def test_the_sample_rate_sets_the_feature_length_and_so_the_audio_tokens(tmp_path):
    (tmp_path / "a.wav").write_bytes(_tone(440, rate=22050, seconds=1.0))
    row = {"q": "<audio>pitch?", "audios": "a.wav", "a": "x"}
    got = {}
    for rate in (None, 8000, 32000):  # None: the seed's 16000
        s = _sample(tmp_path, row, audio_sample_rate=rate)
        mm = s.multimodal_inputs
        frames = mm["audio_feature_lengths"]
        got[rate] = frames[0]
        assert mm["input_features"].shape == (16, frames[0])
        assert s.tokens.count(AUDIO_PAD_ID) == audio_token_count(frames[0])
        x, sent_rate = load_audio(mm["audio_data"][0], "r")  # the engine gets the clip at the run's rate
        assert sent_rate == (rate or 16000) and len(x) == sent_rate
    assert got == {None: 100, 8000: 50, 32000: 200}  # rate / 160 frames a second
    assert audio_token_count(100) == 25


def _av_row(tmp_path: Path) -> dict:
    (tmp_path / "track.wav").write_bytes(_tone(300, seconds=4.0))
    (tmp_path / "a.wav").write_bytes(_tone(600, seconds=0.5))
    return {"q": [{"role": "user", "content": "<audio>then<video>which?"}], "audios": ["a.wav"],
            "videos": [{"frames": _frames(tmp_path, 8), "fps": 2.0, "audio": "track.wav"}], "a": "x"}


def test_use_audio_in_video_puts_the_sound_track_in_with_the_frames(tmp_path):
    row = _av_row(tmp_path)
    plain = _sample(tmp_path, row, multimodal_keys=AV)
    both = _sample(tmp_path, row, multimodal_keys=AV, use_audio_in_video=True)
    # without the flag the track is ignored: one clip, the video its pads only
    assert plain.multimodal_inputs["audio_feature_lengths"] == [50]
    assert "use_audio_in_video" not in media_request_fields(plain.multimodal_inputs)
    assert plain.tokens.count(AUDIO_PAD_ID) == audio_token_count(50)
    # with it: the track is the second clip (prompt order), its tokens inside the video's, interleaved by chunk
    mm = both.multimodal_inputs
    assert mm["audio_feature_lengths"] == [50, 400]
    assert media_request_fields(mm)["use_audio_in_video"] is True and len(media_request_fields(mm)["audio_data"]) == 2
    assert both.tokens.count(AUDIO_PAD_ID) == audio_token_count(50) + audio_token_count(400)
    assert both.tokens.count(VIDEO_PAD_ID) == plain.tokens.count(VIDEO_PAD_ID)
    video = both.tokens[both.tokens.index(VIDEO_PAD_ID) - 1:]
    assert video[0] == AUDIO_START_ID and AUDIO_END_ID in video
    inside = video[1:video.index(AUDIO_END_ID)]
    runs = [t for i, t in enumerate(inside) if i == 0 or inside[i - 1] != t]
    assert runs == [VIDEO_PAD_ID, AUDIO_PAD_ID, VIDEO_PAD_ID, AUDIO_PAD_ID]  # 4 s in 2 s chunks
    silent = dict(row, videos=[{"frames": _frames(tmp_path, 8), "fps": 2.0}])
    with pytest.raises(DataError, match=r"a.jsonl:1: video 0 has no sound track: with --use-audio-in-video"):
        _sample(tmp_path, silent, multimodal_keys=AV, use_audio_in_video=True)


@pytest.mark.parametrize(("grid", "seconds", "audio_tokens"), [([2, 4, 4], 1.0, 25), ([4, 2, 2], 1.0, 100),
                                                               ([3, 2, 4], 0.8, 7), ([8, 2, 2], 1.5, 300)])
def test_the_interleaving_is_qwen2_5_omni_processors(grid, seconds, audio_tokens):
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor as Processor

    if not hasattr(Processor, "replace_video_with_audio_token"):
        pytest.skip("this transformers' Qwen2_5OmniProcessor interleaves inline (no replace_video_with_audio_token)")

    stub = types.SimpleNamespace(video_processor=types.SimpleNamespace(merge_size=2), audio_bos_token="",
                                 audio_eos_token="", video_token="<|video_pad|>", audio_token="<|AUDIO|>")
    stub.get_chunked_index = lambda idx, n: Processor.get_chunked_index(stub, idx, n)
    theirs = Processor.replace_video_with_audio_token(
        stub, {"video_grid_thw": [grid], "video_second_per_grid": [seconds]}, 0, {"num_audio_tokens": [audio_tokens]},
        0, position_id_per_seconds=25, seconds_per_chunk=2)
    assert interleave_video_audio(grid, 4, seconds, audio_tokens, 25.0, 2.0) == theirs


def test_a_seed_001_row_with_image_video_and_audio_columns_loads(tmp_path):
    """Seed 001's example row, with an image, a video and an audio column, and the placeholders in its prompt."""
    Image.new("RGB", (32, 32), (0, 0, 200)).save(tmp_path / "img.png")
    (tmp_path / "a.wav").write_bytes(_tone(440, seconds=0.5))
    row = {"q": [{"role": "user", "content": "<image><audio><video>Which colour? <answer>A</answer> or B"}],
           "images": ["img.png"], "videos": [_frames(tmp_path)], "audios": ["a.wav"], "a": "<answer>B</answer>"}
    s = _sample(tmp_path, row, multimodal_keys=KEYS)
    assert s.tokens.count(IMAGE_PAD_ID) == 4 and s.tokens.count(VIDEO_PAD_ID) == 2 * 4
    assert s.tokens.count(AUDIO_PAD_ID) == audio_token_count(50)
    assert not any(tag in s.prompt for tag in ("<image>", "<video>", "<audio>"))
    assert sorted(media_request_fields(s.multimodal_inputs)) == ["audio_data", "image_data", "video_data"]
    with pytest.raises(DataError, match=r"a.jsonl:1: 1 audio\(s\) in column 'audios' but 0 <audio> placeholder"):
        _sample(tmp_path, dict(row, q="<image><video>no audio here"), multimodal_keys=KEYS)


# ---------------------------------------------------------------- engine and trainer
@pytest.fixture(scope="module")
def model():
    return build_model(OMNI, seed=1)


def _request(s, seed: int, **kw) -> dict:
    return {"input_ids": list(s.tokens), **media_request_fields(s.multimodal_inputs), "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": seed}, **kw}


def test_engine_and_trainer_agree_on_audio_prompts(tmp_path, model):
    row = _av_row(tmp_path)
    samples = [_sample(tmp_path, row, multimodal_keys=AV),
               _sample(tmp_path, row, multimodal_keys=AV, use_audio_in_video=True),
               _sample(tmp_path, {"q": "<audio>?", "audios": "a.wav", "a": "x"})]
    text = TOK.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    engine = EmbeddedEngine(model, eos_token_ids=[2], tokenizer=TOK)
    requests = [_request(s, seed=i) for i, s in enumerate(samples)]
    requests.insert(1, {"input_ids": text, "return_logprob": True,  # a text row in the same prefill batch
                        "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 9}})
    answers = engine.generate(requests)
    rows = [samples[0], None, *samples[1:]]
    train = [TrainSample(tokens=r["input_ids"] + a["output_ids"], response_length=len(a["output_ids"]),
                         loss_mask=[1] * len(a["output_ids"]), reward=0.0, vision=_vision(s) if s else None)
             for r, a, s in zip(requests, answers, rows, strict=True)]
    lp, _ = response_log_probs(model, build_model_inputs(train, max(t.response_length for t in train), 0, "cpu"),
                               temperature=1.0, with_entropy=False)
    for i, a in enumerate(answers):
        engine_lp = [e[0] for e in a["meta_info"]["output_token_logprobs"]]
        assert lp[i, :len(engine_lp)].tolist() == pytest.approx(engine_lp, abs=1e-5)
    # the sound matters: another clip of the same length, the same tokens, other log-probs
    other = dict(requests[-1], audio_data=[encode_wav(np.zeros(8000, np.float32), 16000)])
    assert engine.generate([other])[0]["meta_info"]["output_token_logprobs"][0][0] != pytest.approx(
        answers[-1]["meta_info"]["output_token_logprobs"][0][0], abs=1e-6)


@pytest.mark.parametrize(("change", "expected"), [
    ({"audio_data": None}, "generate: audio_data has 0 item(s) of 0 tokens in all, but input_ids hold 12 <|AUDIO|>"),
    ({"audio_data": ["https://host/a.wav"]}, "generate: audio_data[0]: audio URL https://host/a.wav cannot be fetched"),
    ({"audio_data": [encode_wav(np.zeros(16000, np.float32), 16000)]},
     "generate: audio_data has 1 item(s) of 25 tokens in all, but input_ids hold 12 <|AUDIO|> tokens"),
])
def test_a_bad_audio_request_is_refused_in_one_line(tmp_path, model, change, expected):
    (tmp_path / "a.wav").write_bytes(_tone(440, seconds=0.5))
    s = _sample(tmp_path, {"q": "<audio>?", "audios": "a.wav", "a": "x"})
    engine = EmbeddedEngine(model, eos_token_ids=[2], tokenizer=TOK)
    with pytest.raises(ValueError) as err:
        engine.make_request({**_request(s, seed=1), **change})
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_engine_resamples_audio_data_to_its_rate(model):
    clip = np.sin(2 * np.pi * 440 * np.arange(8000) / 8000).astype(np.float32)
    for rate, frames in ((16000, 100), (8000, 50)):
        engine = EmbeddedEngine(model, eos_token_ids=[2], tokenizer=TOK, audio_sample_rate=rate)
        ids = [AUDIO_START_ID, *[AUDIO_PAD_ID] * audio_token_count(frames), AUDIO_END_ID, 5]
        req = engine.make_request({"input_ids": ids, "audio_data": [encode_wav(clip, 8000)],
                                   "sampling_params": {"max_new_tokens": 1}})
        assert req.media["audio_feature_lengths"].tolist() == [frames]
    assert log_mel(clip, 8000, 16).shape == (16, 50)


def _omni_backend(*flags: str) -> TorchTrainBackend:
    args = parse_args(["--preset", "vlm-quickstart", "--hf-checkpoint", OMNI, "--multimodal-keys", json.dumps(KEYS),
                       "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
                       "--micro-batch-size", "2", "--lr", "1e-2", *flags])
    return TorchTrainBackend(TrainerConfig.from_args(args), "cpu")


def _train_samples(tmp_path: Path) -> list[TrainSample]:
    out = []
    for i, freq in enumerate((220, 440, 660, 880)):
        (tmp_path / f"{i}.wav").write_bytes(_tone(freq, seconds=0.5))
        s = _sample(tmp_path, {"q": "<audio>pitch?", "audios": f"{i}.wav", "a": "x"})
        answer = TOK.encode("lmhx"[i], add_special_tokens=False)
        out.append(TrainSample(tokens=s.tokens + answer, response_length=1, loss_mask=[1], reward=float(i % 2),
                               rollout_log_probs=[-4.6], vision=_vision(s)))
    return out


@pytest.mark.parametrize("frozen", [False, True])
def test_the_trainer_trains_or_freezes_the_audio_tower_and_syncs_every_tensor(tmp_path, model, frozen):
    backend = _omni_backend(*(["--freeze-params-name-list", r"audio_tower\."] if frozen else []))
    before = {k: v.detach().clone() for k, v in backend.model.state_dict().items()}
    backend.train_rollout(_train_samples(tmp_path), 0)
    after = backend.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    audio = {k for k in before if "audio_tower." in k}  # model.audio_tower.* (transformers 5.24), audio_tower.* (5.17)
    assert any(".layers." in k and k not in audio and "visual." not in k for k in changed)  # the text model trains
    if frozen:
        assert not changed & audio
    else:  # the gradient reaches the audio tower through the audio tokens' embeddings
        assert {k.rsplit("audio_tower.", 1)[1] for k in changed & audio} >= {"conv1.weight", "proj.weight"}
    engine = EmbeddedEngine(build_model(OMNI, seed=2), eos_token_ids=[2], tokenizer=TOK)
    engine.update_weights_from_tensors(list(backend.device_named_tensors()))
    sums = engine.weight_checksums()
    assert sums == backend.checksums() and {checkpoint_name(k) for k in audio} <= set(sums)  # sync: checkpoint names


def test_audio_flags_need_an_audio_tower_and_a_sane_rate():
    with pytest.raises(ConfigError, match=r"--multimodal-keys audio needs an --hf-checkpoint with an audio tower; "
                                          r"tiny-qwen2.5-vl has none \(e\.g\. --hf-checkpoint tiny-qwen2.5-omni\)"):
        parse_args(["--preset", "vlm-quickstart", "--multimodal-keys", '{"image": "images", "audio": "a"}'])
    with pytest.raises(ConfigError, match=r"--use-audio-in-video needs an --hf-checkpoint with an audio tower"):
        parse_args(["--preset", "vlm-quickstart", "--use-audio-in-video"])
    with pytest.raises(ConfigError, match=r"--audio-sample-rate 200 must be >= 1000 Hz"):
        parse_args(["--preset", "vlm-quickstart", "--hf-checkpoint", OMNI, "--audio-sample-rate", "200"])
    args = parse_args(["--preset", "vlm-quickstart", "--hf-checkpoint", OMNI, "--multimodal-keys", json.dumps(KEYS),
                       "--audio-sample-rate", "8000", "--use-audio-in-video"])
    assert (args.audio_sample_rate, args.use_audio_in_video) == (8000, True)


def test_a_saved_omni_directory_loads_back_offline(model, tmp_path):
    from relax.models import save_hf

    out = save_hf(model, TOK, tmp_path / "hf")
    again = build_model(str(out))
    assert type(again).__name__ == "Qwen2_5OmniThinkerForConditionalGeneration"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(),
                                                 strict=True))
    assert load_tokenizer(str(out)).convert_tokens_to_ids("<|AUDIO|>") == AUDIO_PAD_ID


def test_media_ids_in_a_sampled_response_are_text_to_the_positions_and_the_towers(tmp_path, model):
    from relax.models.tokenizer import VISION_START_ID

    (tmp_path / "a.wav").write_bytes(_tone(440, seconds=0.5))
    s = _sample(tmp_path, {"q": "<audio>?", "audios": "a.wav", "a": "x"})
    rows = [TrainSample(tokens=s.tokens + resp, response_length=4, loss_mask=[1] * 4, reward=0.0, vision=_vision(s))
            for resp in ([AUDIO_START_ID, AUDIO_PAD_ID, VISION_START_ID, AUDIO_PAD_ID], [5, 6, 7, 8])]
    lp = [response_log_probs(model, build_model_inputs([r], 4, 0, "cpu"), temperature=1.0,
                             with_entropy=False)[0] for r in rows]
    assert torch.isfinite(lp[0]).all()
    inputs = [build_model_inputs([r], 4, 0, "cpu") for r in rows]
    from relax.backends.torch.vision_inputs import mrope_positions

    pos = [mrope_positions(model, i.input_ids, i.attention_mask, i.vision, None, None)[0] for i in inputs]
    assert torch.equal(pos[0], pos[1])


def test_a_batch_carries_one_audio_data_entry_per_item_and_none_where_an_item_has_no_audio(tmp_path):
    from relax.backends.embedded.server import split_generate
    from relax.engine.rollout.engine_pool import _batched

    (tmp_path / "a.wav").write_bytes(_tone(440, seconds=0.5))
    s = _sample(tmp_path, {"q": "<audio>?", "audios": "a.wav", "a": "x"})
    text = {"input_ids": [5, 6], "return_logprob": True, "sampling_params": {"max_new_tokens": 1}}
    body = _batched([_request(s, 1, use_audio_in_video=True), text])
    assert body["audio_data"] == [s.multimodal_inputs["audio_data"], None] and body["use_audio_in_video"] is True
    singles, is_batch = split_generate(body)
    assert is_batch and [x["audio_data"] for x in singles] == body["audio_data"]


@pytest.mark.ray
def test_relax_train_runs_the_omni_model_on_audio_and_syncs_its_audio_tower(tmp_path):
    """The whole path on CPU, two steps: audio rows -> engine audio_data -> trainer -> weight sync, every tensor."""
    train_omni_on_tones(tmp_path, "cpu")


def train_omni_on_tones(tmp_path, device: str) -> None:
    """Two steps of the omni model on high/low tones on ``device``; weights equal (audio tower included) at
    every sync, and the rollout's log-probs are the trainer's. tests/gpu/test_omni_gpu.py runs it on CUDA."""
    from tests.e2e_helpers import assert_ok, read_jsonl, run_relax

    rows = []
    for i in range(8):
        x = 0.5 * np.sin(2 * np.pi * (2000 if i % 2 else 300) * np.arange(1600) / 16000).astype(np.float32)
        rows.append({"prompt": [{"role": "user", "content": "<audio>high or low?"}],
                     "audios": [encode_wav(x, 16000)], "label": "hl"[i % 2 == 0]})
    (tmp_path / "pitch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_relax(["--preset", "vlm-quickstart", "--hf-checkpoint", OMNI, "--multimodal-keys",
                      '{"audio": "audios"}', "--prompt-data", str(tmp_path / "pitch.jsonl"), "--num-rollout", "2",
                      "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--micro-batch-size", "8",
                      "--device", device, "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    assert all(m["train/train_rollout_logprob_abs_diff"] < 1e-5 for m in metrics)
    by_version: dict[int, dict[str, dict]] = {}
    for r in read_jsonl(tmp_path / "run" / "weights.jsonl"):
        by_version.setdefault(r["version"], {})[r["side"]] = r["checksums"]
    assert len(by_version) == 3
    for sides in by_version.values():
        assert sides["trainer"] == sides["engine:0"]
        assert any("audio_tower." in name for name in sides["trainer"])
    assert by_version[0]["trainer"] != by_version[2]["trainer"]
