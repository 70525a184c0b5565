"""A vision-language model in the embedded engine and the torch trainer: SGLang's ``image_data`` in /generate,
the same tokens and log-probs on both sides, the vision tower frozen or trained, and the launch-time refusals."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from relax.backends.config import TrainerConfig
from relax.backends.embedded.engine import EmbeddedEngine
from relax.backends.embedded.server import split_generate
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import TrainSample, build_model_inputs
from relax.backends.torch.logprobs import response_log_probs
from relax.core.train_data import _vision
from relax.data.media import encode_png
from relax.data.mm_config import MultimodalConfig
from relax.data.multimodal import MultimodalRows
from relax.data.prompts import SampleBuilder
from relax.engine.rollout.engine_pool import HttpEnginePool, _batched
from relax.models import build_model, load_tokenizer
from relax.models.tasks import dataset_path
from relax.models.tokenizer import IMAGE_PAD_ID
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError

VLM = "tiny-qwen2.5-vl"
TOK = load_tokenizer(VLM)


@pytest.fixture(scope="module")
def model():
    return build_model(VLM, seed=1)


def _samples(model, n: int = 4):
    rows = MultimodalRows(MultimodalConfig({"image": "images"}, None, None, None, 0), model.config)
    builder = SampleBuilder(TOK, "prompt", "label", "metadata", True, None, None, "tools", None, media=rows)
    path = dataset_path("colorshape")
    records = [json.loads(line) for line in path.read_text().splitlines()[:n]]
    return builder.build_all(records, path=str(path))[0]


def _request(s, seed: int, **kw):
    return {"input_ids": list(s.tokens), "image_data": s.multimodal_inputs["image_data"], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": seed}, **kw}


def test_engine_and_trainer_agree_on_the_tokens_and_log_probs_of_image_prompts(model):
    samples = _samples(model)
    text = TOK.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    engine = EmbeddedEngine(model, eos_token_ids=[2], tokenizer=TOK)
    requests = [_request(s, seed=i) for i, s in enumerate(samples)]
    requests.insert(2, {"input_ids": text, "return_logprob": True,  # a text row in the same prefill batch
                        "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 9}})
    answers = engine.generate(requests)
    train = []
    for req, answer, s in zip(requests, answers, [*samples[:2], None, *samples[2:]], strict=True):
        out = answer["output_ids"]
        train.append(TrainSample(tokens=req["input_ids"] + out, response_length=len(out), loss_mask=[1] * len(out),
                                 reward=0.0, vision=_vision(s) if s is not None else None))
    width = max(t.response_length for t in train)
    trainer_lp, _ = response_log_probs(model, build_model_inputs(train, width, 0, "cpu"), temperature=1.0,
                                       with_entropy=False)
    for i, answer in enumerate(answers):
        engine_lp = [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
        assert trainer_lp[i, :len(engine_lp)].tolist() == pytest.approx(engine_lp, abs=1e-5)
    # the image changes the answer: the same tokens with another picture give other log-probs
    other = dict(requests[0], image_data=[encode_png(Image.new("RGB", (32, 32), (0, 0, 0)))])
    assert engine.generate([other])[0]["meta_info"]["output_token_logprobs"][0][0] != pytest.approx(
        answers[0]["meta_info"]["output_token_logprobs"][0][0], abs=1e-6)


@pytest.mark.parametrize(("change", "expected"), [
    ({"image_data": None}, "generate: input_ids hold image or video tokens but the request has no image_data or video_data"),
    ({"image_data": ["https://host/a.png"]}, "image URL https://host/a.png cannot be fetched: runs are offline"),
    ({"image_data": [encode_png(Image.new("RGB", (64, 32)))]},
     "generate: image_data has 1 item(s) of 8 tokens in all, but input_ids hold 4 <|image_pad|> tokens"),
    ({"logprob_start_len": 0}, "prompt log-probs (logprob_start_len >= 0) and --true-on-policy-mode are not"),
    ({"video_data": ["clip.mp4"]}, "generate: video_data[0]: video clip.mp4 is a video file; decoding one needs av"),
    ({"audio_data": ["a.wav"]}, "audio_data"),
])
def test_a_bad_multimodal_request_is_refused_in_one_line(model, change, expected):
    engine = EmbeddedEngine(model, eos_token_ids=[2], tokenizer=TOK)
    with pytest.raises(ValueError) as err:
        engine.make_request({**_request(_samples(model, 1)[0], seed=1), **change})
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_image_data_to_a_text_model_is_refused():
    engine = EmbeddedEngine(build_model("tiny-qwen3", seed=1), eos_token_ids=[2])
    with pytest.raises(ValueError, match="image_data and video_data need a vision-language model; this engine serves a text model"):
        engine.make_request({"input_ids": [5, 6], "image_data": ["x.png"]})


def test_a_batch_carries_one_image_data_entry_per_item(model):
    a, b = _samples(model, 2)
    body = _batched([_request(a, 1), _request(b, 2)])
    assert body["image_data"] == [a.multimodal_inputs["image_data"], b.multimodal_inputs["image_data"]]
    singles, is_batch = split_generate(body)
    assert is_batch and [s["image_data"] for s in singles] == body["image_data"]


def test_the_pool_sends_media_requests_one_per_generate_unless_the_engines_take_media_batches(model):
    """SGLang 0.5.14 fails a batch of media requests when one item is answered before the last is processed (HTTP
    500, a KeyError in its tokenizer manager): the rollout's pool sends those one by one, in order; relax's engines
    take them batched (``batch_media``), and text requests go batched to either."""
    from relax.utils.http_utils import run_closing

    class Client:
        def __init__(self):
            self.bodies = []

        async def generate(self, body):
            self.bodies.append(body)
            ids = body["input_ids"]
            return [{"n": len(x)} for x in ids] if isinstance(ids[0], list) else {"n": len(ids)}

    media = [_request(s, i) for i, s in enumerate(_samples(model, 4))]
    text = [{"input_ids": [5] * (i + 1), "sampling_params": {"max_new_tokens": 1}} for i in range(4)]
    batched = [_batched(media), _batched(text)]
    for requests, batch_media, sent in ((media, False, media), (media, True, batched[:1]), (text, False, batched[1:])):
        client = Client()
        got = run_closing(HttpEnginePool(client, batch_media=batch_media).generate_batch(requests, group_size=2))
        assert got == [{"n": len(r["input_ids"])} for r in requests]  # in order
        assert sorted(client.bodies, key=str) == sorted(sent, key=str)


def _vlm_backend(*flags: str) -> TorchTrainBackend:
    args = parse_args(["--preset", "vlm-quickstart", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                       "--global-batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-2", *flags])
    return TorchTrainBackend(TrainerConfig.from_args(args), "cpu")


def _train_samples(model) -> list[TrainSample]:
    out = []
    for i, s in enumerate(_samples(model)):
        answer = TOK.encode("rgby"[i], add_special_tokens=False)
        out.append(TrainSample(tokens=s.tokens + answer, response_length=1, loss_mask=[1], reward=float(i % 2),
                               rollout_log_probs=[-4.6], vision=_vision(s)))
    return out


@pytest.mark.parametrize("frozen", [False, True])
def test_the_trainer_trains_or_freezes_the_vision_tower(model, frozen):
    backend = _vlm_backend(*(["--freeze-params-name-list", r"\.visual\."] if frozen else []))
    before = {k: v.detach().clone() for k, v in backend.model.state_dict().items()}
    backend.train_rollout(_train_samples(model), 0)
    after = backend.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    visual = {k for k in before if ".visual." in k}
    assert any(".language_model." in k for k in changed)
    if frozen:
        assert not changed & visual
    else:  # the gradient reaches the vision tower through the image tokens' embeddings
        assert {"model.visual.patch_embed.proj.weight", "model.visual.merger.mlp.0.weight"} <= changed


def test_a_vlm_is_refused_by_megatron_and_by_the_slot_runners():
    from relax.utils import validation

    args = parse_args(["--preset", "vlm-quickstart"])
    args.train_backend = "megatron"  # parsed on CPU, megatron fails earlier for want of a GPU; the rule alone:
    with pytest.raises(ConfigError) as err:
        validation._multimodal(args)
    assert str(err.value) == ("not supported yet: --train-backend megatron with a vision-language model "
                              "(tiny-qwen2.5-vl); train it with --train-backend torch")
    with pytest.raises(ValueError, match="not supported yet: the static runner with a vision-language model"):
        EmbeddedEngine(build_model(VLM, seed=1), eos_token_ids=[2], runner="static", max_context_len=64)


def test_the_image_tokens_of_a_sample_are_counted_once(model):
    s = _samples(model, 1)[0]
    assert s.tokens.count(IMAGE_PAD_ID) == sum(t * h * w // 4 for t, h, w in s.multimodal_inputs["image_grid_thw"])


def test_a_saved_vlm_directory_loads_back_offline(model, tmp_path):
    from relax.models import save_hf

    out = save_hf(model, TOK, tmp_path / "hf")
    again = build_model(str(out))
    assert type(again).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(),
                                                 strict=True))
    assert load_tokenizer(str(out)).convert_tokens_to_ids("<|image_pad|>") == IMAGE_PAD_ID
    # the image processor the vision tower is shaped for comes back with it, patching as the rollout does
    from transformers import AutoImageProcessor

    from relax.data.mm_pool import patch_images
    from relax.models.vision import vision_geometry

    picture = Image.new("RGB", (48, 32), (200, 30, 90))
    try:  # the PIL form, as the rollout's; transformers 5.17 (the GPU machine's) loads it only next to torchvision
        loaded = AutoImageProcessor.from_pretrained(str(out), use_fast=False)(images=[picture], return_tensors="np")
    except ImportError as exc:
        pytest.skip(f"AutoImageProcessor of this transformers needs torchvision: {str(exc).strip()[:80]}")
    pixels, grids = patch_images([picture], *vision_geometry(model.config))
    assert grids == [list(map(int, g)) for g in loaded["image_grid_thw"]] == [[1, 4, 6]]
    assert (loaded["pixel_values"] == pixels).all()


def test_eval_sets_carry_their_images_to_the_engine():
    from relax.data.multimodal import media_request_fields
    from relax.engine.rollout.eval_config import EvalConfig
    from relax.engine.rollout.evaluation import load_eval_sets

    args = parse_args(["--preset", "vlm-quickstart", "--eval-prompt-data", "shapes", str(dataset_path("colorshape"))])
    (shapes,) = load_eval_sets(EvalConfig.from_args(args), TOK)
    first = shapes.prompts[0]
    assert first.tokens.count(IMAGE_PAD_ID) == 4
    assert media_request_fields(first.multimodal_inputs) == {"image_data": first.multimodal_inputs["image_data"]}
    assert media_request_fields(None) == {}


def test_a_request_holds_one_image_pad_per_image_as_sglang_takes_it(model):
    """SGLang's HF processor expands every <|image_pad|> of a prompt into one image's tokens, so the rollout sends
    one per image (relax/data/multimodal.py one_pad_per_image); the engine expands it back to the sample's own
    tokens and answers exactly as for the expanded prompt."""
    from relax.backends.embedded.image_data import expand_image_pads
    from relax.engine.rollout.config import RolloutConfig
    from relax.engine.rollout.prompt_input import prompt_fields
    from relax.engine.rollout.state import GenerateState

    s = _samples(model, 1)[0]
    ids = prompt_fields(s, False, IMAGE_PAD_ID)["input_ids"]
    assert ids.count(IMAGE_PAD_ID) == 1 and len(ids) == len(s.tokens) - 3  # 4 pads -> 1
    assert expand_image_pads(ids, IMAGE_PAD_ID, [4]) == s.tokens
    assert prompt_fields(s, False)["input_ids"] == s.tokens  # no pad id known: the tokens as they are
    with pytest.raises(ValueError, match="has images, which go as token ids"):  # as text: refused, not flattened
        prompt_fields(s, True, IMAGE_PAD_ID)
    # a response keeps its tokens (a sampled pad there is text)
    s.tokens, s.response_length = s.tokens + [IMAGE_PAD_ID, IMAGE_PAD_ID], 2
    sent = prompt_fields(s, False, IMAGE_PAD_ID)["input_ids"]
    assert sent[-2:] == [IMAGE_PAD_ID] * 2 and sent.count(IMAGE_PAD_ID) == 3
    s = _samples(model, 1)[0]
    engine = EmbeddedEngine(model, eos_token_ids=[2], tokenizer=TOK)
    one = dict(_request(s, seed=5), input_ids=ids, return_prompt_token_ids=True)
    expanded, collapsed = engine.generate([_request(s, seed=5, return_prompt_token_ids=True), one])
    assert collapsed["output_ids"] == expanded["output_ids"]
    assert collapsed["meta_info"]["output_token_logprobs"] == expanded["meta_info"]["output_token_logprobs"]
    args = parse_args(["--preset", "vlm-quickstart"])
    GenerateState.reset()  # the process-wide instance: another test's may still be installed
    try:
        assert GenerateState(args, config=RolloutConfig.from_args(args), tokenizer=TOK).image_pad_id == IMAGE_PAD_ID
    finally:
        GenerateState.reset()
    GenerateState.reset()


def test_sglang_is_refused_a_vlm_whose_patches_it_would_skip_and_media_it_has_not_served():
    """SGLang 0.5.14 runs Qwen2.5-VL's vision tower only on 1176-value patch rows (14-pixel patches): the 8-pixel tiny
    model would be served without its vision tower, silently. Videos and audio have not run against SGLang."""
    from relax.backends.sglang.vision import sglang_vision_problems

    def problems(checkpoint, keys):
        from relax.models.registry import resolve_checkpoint

        return sglang_vision_problems(keys, resolve_checkpoint(checkpoint).config, checkpoint)

    assert problems("tiny-qwen2.5-vl-p14", {"image": "images"}) == []
    assert problems("tiny-qwen2.5-vl", {"image": "images"}) == [
        "--rollout-backend sglang cannot serve tiny-qwen2.5-vl: its patches hold 384 values and SGLang 0.5.14 runs "
        "the vision tower only on 1176 (14-pixel patches; e.g. --hf-checkpoint tiny-qwen2.5-vl-p14)"]
    assert problems("tiny-qwen2.5-vl-p14", {"image": "i", "video": "v"}) == [
        "not supported yet: --multimodal-keys video with --rollout-backend sglang (only images have run against SGLang)"]
    with pytest.raises(ConfigError, match="cannot serve tiny-qwen2.5-vl: its patches hold 384 values"):
        parse_args(["--preset", "vlm-quickstart", "--rollout-backend", "sglang"])


def test_a_partial_rollout_resumes_a_picture_sample_as_one_uninterrupted_request(model):
    """--partial-rollout sends every request, first and resumed, by `resume_request`: with the sample's pictures
    and one pad per picture, so a sample cut after 3 tokens and resumed answers as one 6-token request does."""
    from relax.engine.rollout.partial_samples import append_response, resume_request

    engine = EmbeddedEngine(model, eos_token_ids=[], tokenizer=TOK)
    params = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    whole = engine.generate([resume_request(_samples(model, 1)[0], params, "a", IMAGE_PAD_ID)])[0]
    sample = _samples(model, 1)[0]
    first = resume_request(sample, dict(params, max_new_tokens=3), "b", IMAGE_PAD_ID)
    assert first["image_data"] == sample.multimodal_inputs["image_data"]
    assert first["input_ids"].count(IMAGE_PAD_ID) == len(first["image_data"]) < sample.tokens.count(IMAGE_PAD_ID)
    append_response(sample, engine.generate([first])[0])
    rest = engine.generate([resume_request(sample, params, "c", IMAGE_PAD_ID)])[0]
    assert sample.tokens[-3:] == whole["output_ids"][:3] and rest["output_ids"] == whole["output_ids"][3:]
    got = sample.rollout_log_probs + [e[0] for e in rest["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx([e[0] for e in whole["meta_info"]["output_token_logprobs"]], abs=1e-5)


def test_an_opd_teacher_server_is_refused_media_prompts():
    with pytest.raises(ConfigError, match=r"not supported yet: --opd-type sglang with --multimodal-keys \(the "
                                          r"teacher's prompt-logprob requests carry no media\)"):
        parse_args(["--preset", "vlm-quickstart", "--use-opd", "--opd-type", "sglang", "--rm-url", "127.0.0.1:1"])
