"""The embedded engine server over HTTP, driven by the production client (EngineClient)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import torch

from relax.backends.embedded.launch import EngineProcess
from relax.engine.rollout.engine_client import EngineClient, EngineError, EngineHTTPError
from relax.utils.http_utils import post, run_closing
from relax.weights.checksum import state_checksums
from relax.weights.devices import device_identity
from relax.weights.push import WeightPusher
from relax.weights.transports import SyncTarget

torch.set_num_threads(1)
SEED = 1234


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny(seed: int):
    from relax.models import build_model

    return build_model("tiny-qwen3", seed=seed).eval()


@pytest.fixture(scope="module")
def engine():
    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--seed", str(SEED)])
    yield proc
    proc.stop()


@pytest.fixture
def client(engine) -> EngineClient:
    return EngineClient(engine.url, timeout=60)


def push(url: str, state: dict, version: int, transport: str = "tensor"):
    """A sync as the trainer runs it (`WeightPusher`): ``tensor`` shares host memory with the engine process
    (SGLang's serialized_named_tensors, flattened_bucket), ``distributed`` broadcasts over gloo."""
    pusher = WeightPusher(timeout_s=60)
    try:
        buckets = [list(state.items())[:3], list(state.items())[3:]]  # two buckets: the version flips with the last
        return pusher.push(buckets, [SyncTarget("engine:0", url, device_identity("cpu"))], version,
                           requested=transport, weights_device=torch.device("cpu"))
    finally:
        pusher.close()


@pytest.fixture
def reset_weights(engine):
    """Tests that change weights put the seed-SEED weights back afterwards."""
    yield
    push(engine.url, tiny(SEED).state_dict(), 0)


def gen(ids, *, seed=None, max_new=16, temperature=1.0, **kw):
    return {"input_ids": list(ids), "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": temperature, "sampling_seed": seed}, **kw}


def test_generate_logprobs_match_full_forward(client) -> None:
    prompts = [[5, 6, 7, 8], [20, 21], [30, 31, 32, 33, 34, 35]]
    responses = run_closing(client.generate([gen(p, seed=i, max_new=24) for i, p in enumerate(prompts)]))
    model = tiny(SEED)
    diffs = []
    for p, resp in zip(prompts, responses, strict=True):
        out = resp["output_ids"]
        assert resp["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([p + out])).logits[0].float(), -1)
        ref = logp[torch.arange(len(p) - 1, len(p) + len(out) - 1), torch.tensor(out)]
        got = torch.tensor([x[0] for x in resp["meta_info"]["output_token_logprobs"]])
        diffs.append((got - ref).abs())
    assert torch.cat(diffs).mean() < 1e-4


def test_batch_body_and_recipe_post_helper(engine) -> None:
    body = {"input_ids": [[5, 6], [7]], "sampling_params": {"max_new_tokens": 3, "sampling_seed": 3}, "return_logprob": True}
    out = run_closing(post(f"{engine.url}/generate", body))
    assert len(out) == 2 and all(len(r["output_ids"]) == 3 for r in out)
    single = run_closing(post(f"{engine.url}/generate", gen([5, 6], seed=3, max_new=3)))
    assert single["output_ids"] == out[0]["output_ids"]


def test_same_seed_same_output_under_concurrency(client) -> None:
    async def go():
        noise = [client.generate(gen([i + 3, i + 4], seed=None, max_new=30)) for i in range(6)]
        a, b, *_ = await asyncio.gather(client.generate(gen([9, 9, 9], seed=77, max_new=30)),
                                        client.generate(gen([9, 9, 9], seed=77, max_new=30)), *noise)
        c = await client.generate(gen([9, 9, 9], seed=77, max_new=30))
        return a, b, c

    a, b, c = run_closing(go())
    assert a["output_ids"] == b["output_ids"] == c["output_ids"]
    lp = [[x[0] for x in r["meta_info"]["output_token_logprobs"]] for r in (a, c)]
    assert lp[0] == pytest.approx(lp[1], abs=1e-5)


def test_concurrent_requests_share_decode_steps(client) -> None:
    async def go():
        before = (await client.server_info())["relax_engine"]["steps"]
        await asyncio.gather(*(client.generate(gen([3 + i], seed=i, max_new=40)) for i in range(8)))
        return (await client.server_info())["relax_engine"]["steps"] - before

    steps = run_closing(go())
    assert steps < 8 * 40 / 2  # sequential would take 320 steps


def test_abort_returns_partial_and_resume_continues(client) -> None:
    prompt, total = [11, 12, 13], 480

    async def go():
        task = asyncio.create_task(client.generate(gen(prompt, temperature=0.0, max_new=total, rid="long")))
        for _ in range(200):
            await asyncio.sleep(0.02)
            if (await client.server_info())["relax_engine"]["running"]:
                break
        await asyncio.sleep(0.05)
        await client.pause_generation(mode="in_place")  # hold it mid-flight, then abort it
        assert (await client.server_info())["relax_engine"]["running"] == 1
        assert await client.abort_request("long") is None  # SGLang answers an empty 200
        await client.continue_generation()
        partial = await task
        n = len(partial["output_ids"])
        resumed = await client.generate(gen(prompt + partial["output_ids"], temperature=0.0, max_new=total - n))
        straight = await client.generate(gen(prompt, temperature=0.0, max_new=total))
        return partial, resumed, straight

    partial, resumed, straight = run_closing(go())
    assert partial["meta_info"]["finish_reason"]["type"] == "abort"
    n = len(partial["output_ids"])
    assert 0 < n < total and len(partial["meta_info"]["output_token_logprobs"]) == n
    assert partial["output_ids"] + resumed["output_ids"] == straight["output_ids"]
    lp = [x[0] for x in partial["meta_info"]["output_token_logprobs"]]
    assert lp == pytest.approx([x[0] for x in straight["meta_info"]["output_token_logprobs"][:n]], abs=1e-5)


def test_pause_in_place_and_continue(client) -> None:
    async def go():
        await client.pause_generation(mode="in_place")
        task = asyncio.create_task(client.generate(gen([4, 5], seed=1, max_new=8)))
        await asyncio.sleep(0.3)
        waited = not task.done()
        await client.continue_generation()
        return waited, await task

    waited, resp = run_closing(go())
    assert waited and resp["meta_info"]["finish_reason"]["type"] == "length"


def test_pause_abort_mode_aborts_running(client) -> None:
    async def go():
        task = asyncio.create_task(client.generate(gen([4, 5], temperature=0.0, max_new=480)))
        for _ in range(200):
            await asyncio.sleep(0.02)
            if (await client.server_info())["relax_engine"]["running"]:
                break
        await client.pause_generation()
        resp = await task
        await client.continue_generation()
        after = await client.generate(gen([4, 5], max_new=2))
        return resp, after

    resp, after = run_closing(go())
    assert resp["meta_info"]["finish_reason"]["type"] == "abort"
    assert after["meta_info"]["finish_reason"]["type"] in ("length", "stop")


@pytest.mark.parametrize("transport", ["tensor", "distributed"])
def test_weight_sync_transports_update_every_tensor_and_flip_the_version_last(engine, client, reset_weights,
                                                                           transport) -> None:
    """Both transports end to end against a separate engine process: ``tensor`` hands the engine named
    shared-memory segments through SGLang's serialized_named_tensors, ``distributed`` a gloo broadcast."""
    src = tiny(seed=99).state_dict()
    report = push(engine.url, src, 5, transport)
    expected = state_checksums(src.items())
    assert report.transports == {transport: ["engine:0"]} and report.buckets == 2
    assert report.trainer_checksums == expected == report.target_checksums["engine:0"]
    assert run_closing(client.checksums()) == expected and run_closing(client.weight_version()) == 5
    assert run_closing(client.generate(gen([1, 2], seed=0, max_new=2)))["meta_info"]["weight_version"] == "5"


def test_update_weights_from_disk(client, reset_weights, tmp_path) -> None:
    src = tiny(seed=98)
    src.save_pretrained(tmp_path, safe_serialization=True)
    res = run_closing(client.update_weights_from_disk(tmp_path, weight_version=41))
    assert res["success"] and run_closing(client.weight_version()) == 41
    assert run_closing(client.checksums()) == state_checksums(src.state_dict().items())
    with pytest.raises(EngineHTTPError, match="no \\*.safetensors"):
        run_closing(client.update_weights_from_disk(tmp_path / "missing"))


def test_update_weights_from_distributed_one_broadcast_per_tensor(client, reset_weights) -> None:
    """SGLang's load_format None: one broadcast per named tensor, in order (what other senders do)."""
    from relax.weights.update_group import WeightUpdateGroup

    src = tiny(seed=97).state_dict()
    port = free_port()

    async def go():
        own = asyncio.to_thread(WeightUpdateGroup, "127.0.0.1", port, 0, 2, group_name="g", backend="gloo",
                                timeout_s=60)
        group, joined = await asyncio.gather(own, client.init_weights_update_group("127.0.0.1", port, 1, 2,
                                                                                 group_name="g", backend="gloo"))
        try:
            names = list(src)
            post_ = client.update_weights_from_distributed(names, [str(src[n].dtype).removeprefix("torch.")
                                                                   for n in names],
                                                           [list(src[n].shape) for n in names], group_name="g",
                                                           weight_version=7)
            answer, _ = await asyncio.gather(post_, asyncio.to_thread(group.broadcast, [src[n] for n in names]))
            destroyed = await client.destroy_weights_update_group("g")
        finally:
            group.close()
        return joined, answer, destroyed, await client.weight_version(), await client.checksums()

    joined, answer, destroyed, version, sums = run_closing(go())
    assert joined["success"] and answer["success"] and destroyed["success"]
    assert version == 7 and sums == state_checksums(src.items())


def test_weights_checker_reset_then_sync(engine, client, reset_weights) -> None:
    trainer = tiny(SEED).state_dict()
    expected = state_checksums(trainer.items())

    async def go():
        snap = await client.weights_checker("snapshot")
        await client.weights_checker("reset_tensors")
        after_reset = await client.checksums()
        with pytest.raises(EngineHTTPError, match="tensors differ from the snapshot") as changed:
            await client.weights_checker("compare")
        return snap, after_reset, changed.value

    snap, after_reset, changed = run_closing(go())
    assert snap["success"] and changed.status == 400
    assert all(after_reset[k] != expected[k] for k in expected)
    push(engine.url, trainer, 0)
    assert run_closing(client.checksums()) == expected and run_closing(client.weights_checker("compare"))["success"]
    with pytest.raises(EngineHTTPError, match="Unsupported action='explode'"):  # SGLang's words
        run_closing(client.weights_checker("explode"))


def test_release_and_resume_memory(client, engine, reset_weights) -> None:
    """SGLang's default (no --enable-weights-cpu-backup): a release discards the weights, so after a resume
    generation is refused, naming a weight, until a sync has written every one; then it serves as before."""
    prompt = gen([1, 2, 3], seed=7, max_new=6)
    state = tiny(SEED).state_dict()

    async def go():
        before = await client.generate(prompt)
        await client.release_memory_occupation()
        try:
            with pytest.raises(EngineHTTPError) as released:
                await client.generate(prompt)
        finally:
            await client.resume_memory_occupation()
        with pytest.raises(EngineHTTPError) as unwritten:
            await client.generate(prompt)
        return before, released.value, unwritten.value

    before, released, unwritten = run_closing(go())
    assert released.status == 409 and "released" in released.server_message
    assert unwritten.status == 409 and "hold no values since resume_memory_occupation" in unwritten.server_message
    push(engine.url, {k: v for k, v in state.items() if k != "model.norm.weight"}, 0)  # all but one: still refused
    with pytest.raises(EngineHTTPError, match="1 weight tensor.*'model.norm.weight'"):
        run_closing(client.generate(prompt))
    push(engine.url, state, 0)
    after = run_closing(client.generate(prompt))
    assert after["output_ids"] == before["output_ids"]


def test_weights_cpu_backup_keeps_the_weights_across_a_release(tmp_path) -> None:
    """--enable-weights-cpu-backup (SGLang's flag): the weights survive release + resume, no sync needed."""
    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--seed", str(SEED), "--enable-weights-cpu-backup"],
                               log_dir=tmp_path)
    try:
        c = EngineClient(proc.url, timeout=60)
        prompt = gen([1, 2, 3], seed=7, max_new=6)

        async def go():
            before = await c.generate(prompt)
            await c.release_memory_occupation()
            await c.resume_memory_occupation()
            return before, await c.generate(prompt), await c.checksums()

        before, after, sums = run_closing(go())
        assert after["output_ids"] == before["output_ids"]
        assert sums == state_checksums(tiny(SEED).state_dict().items())
    finally:
        proc.stop()


@pytest.mark.parametrize("body,message", [
    ("{not json", "malformed JSON"),
    ('[1, 2]', "must be an object"),
    ('{"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}', "max_new_tokens"),
    ('{"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}', "max_new_tokens"),
    ('{"input_ids": [1, 2], "return_logprob": true, "logprob_start_len": "x"}', "logprob_start_len"),
    ('{"input_ids": [1], "bogus": true}', "generate: unknown field"),
    ('{"input_ids": [1], "sampling_params": {"nope": 1}}', "sampling_params: unknown field"),
    ('{"input_ids": [1], "sampling_params": {"temperature": "hot"}}',
     "sampling_params.temperature has the wrong type: 'hot'\""),  # the value's closing quote kept
    ('{"input_ids": ' + str(list(range(1, 20)) * 30) + "}", "context length"),
    ('{"input_ids": []}', "non-empty"),
])
def test_bad_input_is_4xx_and_server_keeps_serving(engine, client, body, message) -> None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{engine.url}/generate", data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 400 and message in exc.value.read().decode()
    assert run_closing(client.health())
    assert len(run_closing(client.generate(gen([1], max_new=1)))["output_ids"]) == 1


def test_bad_control_bodies(client) -> None:
    assert run_closing(client._post("/abort_request", {})) is None  # SGLang ignores an abort naming nothing
    with pytest.raises(EngineHTTPError, match="unknown field"):
        run_closing(client._post("/pause_generation", {"mood": "x"}))
    with pytest.raises(EngineHTTPError, match="not base64"):
        run_closing(client.update_weights_from_tensor(["%%%"]))
    with pytest.raises(EngineHTTPError, match="refers to posix.system"):
        run_closing(client.update_weights_from_tensor([__import__("base64").b64encode(
            __import__("pickle").dumps(__import__("os").system)).decode()]))
    with pytest.raises(EngineHTTPError, match="init_weights_update_group first"):
        run_closing(client.update_weights_from_distributed(["lm_head.weight"], ["float32"], [[2]]))
    with pytest.raises(EngineHTTPError, match="disable_draft_model=True is not implemented"):
        run_closing(client._post("/update_weights_from_tensor", {"serialized_named_tensors": ["x"],
                                                         "disable_draft_model": True}))
    with pytest.raises(EngineHTTPError, match="weight_version must be a string"):
        run_closing(client._post("/update_weights_from_disk", {"model_path": "x", "weight_version": 3}))
    with pytest.raises(EngineHTTPError, match="unknown memory tag"):
        run_closing(client.release_memory_occupation(["gpu"]))
    with pytest.raises(EngineHTTPError, match="retract' is not implemented"):
        run_closing(client.pause_generation("retract"))


def test_health_generate_and_info(client) -> None:
    assert run_closing(client.health_generate()) is None  # SGLang answers an empty 200
    info = run_closing(client.server_info())
    assert info["relax_engine"]["device"] == device_identity("cpu") and info["context_length"] == 512
    model = run_closing(client.model_info())
    assert model["weight_version"] == "0" and model["is_generation"] and model["model_type"] == "qwen3"
    assert run_closing(client._call("GET", "/get_model_info")) == model  # SGLang's older names answer too
    assert run_closing(client._call("GET", "/get_weight_version")) == {"weight_version": "0"}


def test_api_key_required_when_given() -> None:
    """(This server also runs the static-slot runner.)"""
    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--api-key", "s3cret", "--runner", "static"])
    try:
        with pytest.raises(EngineHTTPError) as exc:
            run_closing(EngineClient(proc.url).generate(gen([1], max_new=1)))
        assert exc.value.status == 401
        assert len(run_closing(EngineClient(proc.url, api_key="s3cret").generate(gen([1], max_new=1)))["output_ids"]) == 1
    finally:
        proc.stop()


def test_non_loopback_host_needs_api_key() -> None:
    from relax.backends.embedded.server import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--hf-checkpoint", "tiny-qwen3", "--host", "0.0.0.0"])
    assert parse_args(["--hf-checkpoint", "x", "--host", "0.0.0.0", "--api-key", "k"]).api_key == "k"


def test_killed_engine_gives_client_error_within_timeout() -> None:
    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3"])
    client = EngineClient(proc.url, timeout=30, control_timeout=5)

    async def go():
        await client.pause_generation(mode="in_place")  # the request below is in flight for sure
        task = asyncio.create_task(client.generate(gen([3], temperature=0.0, max_new=480)))
        await asyncio.sleep(0.3)
        proc.kill()
        start = time.monotonic()
        with pytest.raises(EngineError) as exc:
            await task
        mid = time.monotonic() - start
        start = time.monotonic()
        with pytest.raises(EngineError) as exc2:
            await client.weight_version()
        return exc.value, mid, exc2.value, time.monotonic() - start

    try:
        err, t1, err2, t2 = run_closing(go())
    finally:
        proc.stop()
    assert proc.url in str(err) and proc.url in str(err2)
    assert t1 < 10 and t2 < 6
    assert not run_closing(client.health(timeout=1))


def test_client_that_gives_up_frees_its_request(client, engine) -> None:
    async def go():
        await client.pause_generation(mode="in_place")
        try:
            with pytest.raises(EngineError, match="no answer within"):
                await EngineClient(engine.url, timeout=0.5).generate(gen([1, 2], max_new=5))
            await asyncio.sleep(0.3)
            return (await client.server_info())["relax_engine"]
        finally:
            await client.continue_generation()

    info = run_closing(go())
    assert info["waiting"] == 0 and info["running"] == 0
