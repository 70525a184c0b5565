"""The Megatron backend itself under TP / PP / EP / DP, on gloo CPU workers (megatron-core with tests/megatron_workers.py's shims).

Each layout builds `MegatronTrainBackend` on every worker, computes the old log-probs of a fixed
batch, takes one optimizer step and exports the weights; rank 0's numbers are compared with one
rank's on the same data:

- data parallelism (with the distributed optimizer) is exact: same log-probs, grad norm to 1e-6,
  bitwise equal weights after the step (the gradient sums are the same terms);
- pipeline parallelism gives the same log-probs bitwise and the grad norm to 1e-5;
- tensor parallelism (with and without sequence parallelism) and expert parallelism change the
  reduction order in bf16: log-probs within 0.02 (the bf16 floor is ~0.006 here) and the grad norm
  within 0.2%.

Checkpoints: saved at DP 2 with the distributed optimizer, loaded at DP 1, the next step's weights
are bitwise those of the uninterrupted run; ``--save-hf`` from a TP x PP model loads back in
transformers with every tensor equal. Needs megatron-core (marker ``megatron``; CI skips).
"""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.megatron.checks import module_available
from tests.gpu.samples import varied_samples

pytestmark = [pytest.mark.megatron,
              pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core")]


def _backend(model: str, world: int, extra: list[str]):
    from relax.backends.megatron import checks
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.utils.arguments import parse_args

    checks._cuda_available = lambda: True  # parse as on the GPU machine; the worker runs megatron on the CPU
    args = parse_args(["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", model,
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "1", "--micro-batch-size", "2", "--lr", "3e-3", "--no-bias-swiglu-fusion",
                       "--no-bias-dropout-fusion", "--no-rope-fusion", "--resource", f'{{"actor": [{world}, {world}]}}', *extra])
    return MegatronTrainBackend(TrainerConfig.from_args(args), "cpu")


def _one_step(rank: int, model: str, world: int, extra: list[str]) -> dict:
    from relax.backends.torch.batch import build_rollout_tensors

    backend = _backend(model, world, extra)
    batch = build_rollout_tensors(varied_samples(0))
    old = backend._log_probs_no_grad(backend.model, batch)
    adv = torch.tensor([1.0 if s.reward else -1.0 for s in batch.samples]).unsqueeze(1) * batch.loss_mask
    metrics = backend._optimizer_step(batch, slice(0, 8), old - 0.1, None, adv)  # ratio e^0.1: a real gradient
    weights = backend.hf_state()
    return {"old": old, "metrics": metrics, "weights": {k: v.clone() for k, v in weights.items()},
            "describe": backend.describe()}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    from tests.megatron_helpers import write_tiny_moe

    return write_tiny_moe(tmp_path_factory.mktemp("moe"))


# The exact layouts run without gradient clipping: the distributed optimizer sums the squared-norm shards in another
# order, so the grad norm differs in its last bits (~1e-8 relative) and, through the clip factor, a handful of bf16
# weights by one ulp; without clipping the update is the data-parallel gradient sum alone, which is exact.
NO_CLIP = ["--clip-grad", "0"]


@pytest.fixture(scope="module")
def one_rank(moe_dir) -> dict:
    from tests.megatron_workers import spawn

    return {"small-qwen3": spawn(_one_step, 1, "small-qwen3", 1, []), "moe": spawn(_one_step, 1, moe_dir, 1, []),
            "small-qwen3-noclip": spawn(_one_step, 1, "small-qwen3", 1, NO_CLIP)}


LAYOUTS = [  # (model, world, flags, exact)
    ("small-qwen3", 2, ["--use-distributed-optimizer", *NO_CLIP], True),
    ("small-qwen3", 2, ["--pipeline-model-parallel-size", "2"], False),
    ("small-qwen3", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"], False),
    ("small-qwen3", 4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], False),
    ("moe", 2, ["--expert-model-parallel-size", "2"], False),
    # megatron-core DDP's overlap: the same sums, started per bucket as the backward fills it
    ("small-qwen3", 2, ["--overlap-grad-reduce", *NO_CLIP], True),
    ("small-qwen3", 2, ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", *NO_CLIP],
     True),
    ("small-qwen3", 2, ["--pipeline-model-parallel-size", "2", "--overlap-grad-reduce"], False),
]


@pytest.mark.parametrize("model, world, flags, exact", LAYOUTS, ids=["dp2-distopt", "pp2", "tp2-sp", "tp2-pp2", "moe-ep2",
                                                                    "dp2-overlap-grad", "dp2-distopt-overlap-both",
                                                                    "pp2-overlap-grad"])
def test_parallel_layout_matches_one_rank(one_rank, moe_dir, model: str, world: int, flags: list[str],
                                          exact: bool) -> None:
    from tests.megatron_workers import spawn

    ref = one_rank[f"{model}-noclip" if exact else model]
    got = spawn(_one_step, world, moe_dir if model == "moe" else model, world, flags)
    lp_diff = float((got["old"] - ref["old"]).abs().max())
    gn, gn_ref = got["metrics"]["grad_norm"], ref["metrics"]["grad_norm"]
    assert set(got["weights"]) == set(ref["weights"])
    if exact:
        assert lp_diff == 0.0 and abs(gn - gn_ref) <= 1e-6 * gn_ref
        assert all(torch.equal(got["weights"][k], v) for k, v in ref["weights"].items())
        return
    tp = "--tensor-model-parallel-size" in flags
    assert lp_diff <= (0.02 if tp else 0.0), lp_diff
    assert abs(gn - gn_ref) <= (2e-3 if tp else 1e-5) * gn_ref, (gn, gn_ref)
    assert got["metrics"]["ppo_kl"] == pytest.approx(ref["metrics"]["ppo_kl"], abs=1e-3)
    moved = max(float((got["weights"][k].float() - ref["weights"][k].float()).abs().max()) for k in ref["weights"])
    assert moved <= 2.5 * 3e-3  # one Adam step moves a weight by at most ~lr; layouts differ by at most 2 lr


def _two_step_rollouts(rank: int, world: int, flags: list[str]) -> dict:
    """Two rollouts of two optimizer steps each (--global-batch-size 4), the weights exported after each."""
    backend = _backend("small-qwen3", world, [*flags, "--global-batch-size", "4"])
    sums = []
    for step in range(2):
        metrics = backend.train_rollout(varied_samples(step), step)
        sums.append((metrics["train/num_optimizer_steps"], backend.checksums()))
    return {"sums": sums}


@pytest.mark.parametrize("flags", [["--overlap-grad-reduce"],
                                   ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]],
                         ids=["overlap-grad", "distopt-overlap-both"])
def test_overlapped_steps_train_bitwise_like_plain_ones_across_steps_and_rollouts(flags: list[str]) -> None:
    """Each step's gradient reduce (and, with --overlap-param-gather, the all-gather of the updated shards the
    next forward waits for) overlaps compute, yet every exported weight equals the plain DP-2 run's, bitwise,
    after two rollouts of two optimizer steps: a gather left unfinished would export stale shards."""
    from tests.megatron_workers import spawn

    plain = spawn(_two_step_rollouts, 2, 2, [f for f in flags if not f.startswith("--overlap")])["sums"]
    overlapped = spawn(_two_step_rollouts, 2, 2, flags)["sums"]
    assert [n for n, _ in plain] == [2.0, 2.0]
    assert overlapped == plain


def _save_then_step(rank: int, world: int, flags: list[str], path: str) -> dict:
    backend = _backend("small-qwen3", world, flags)
    backend.train_rollout(varied_samples(0), 0)
    backend.save(path, save_optimizer=True)
    backend.save(path + "-weights", save_optimizer=False)
    backend.train_rollout(varied_samples(1), 1)
    return {"sums": backend.checksums()}


def _load_then_step(rank: int, world: int, flags: list[str], path: str) -> dict:
    backend = _backend("small-qwen3", world, flags)
    try:
        backend.load(path)
    except ValueError as exc:
        return {"error": str(exc)}
    backend.train_rollout(varied_samples(1), 1)
    return {"sums": backend.checksums()}


def test_checkpoint_resumes_bitwise_on_another_data_parallel_size(tmp_path) -> None:
    from tests.megatron_workers import spawn

    path = str(tmp_path / "iter")
    dist = ["--use-distributed-optimizer"]
    expected = spawn(_save_then_step, 2, 2, dist, path)["sums"]
    resumed = spawn(_load_then_step, 1, 1, dist, path)["sums"]
    assert resumed == expected  # DP 2 -> 1: the distributed optimizer's shards re-split, bitwise
    weights_only = spawn(_load_then_step, 1, 1, dist, path + "-weights")["sums"]
    assert weights_only != expected  # without the Adam moments the next step differs
    refused = spawn(_load_then_step, 2, 2, [*dist, "--tensor-model-parallel-size", "2"], path)
    assert "reshards over data-parallel ranks only" in refused["error"]
    other = spawn(_load_then_step, 1, 1, [], path)
    assert "saved with --use-distributed-optimizer" in other["error"]


def _save_hf(rank: int, world: int, flags: list[str], path: str) -> dict:
    backend = _backend("small-qwen3", world, flags)
    backend.train_rollout(varied_samples(0), 0)
    backend.save_hf(path)
    return {"sums": backend.checksums()}


def test_save_hf_writes_the_gathered_model_once(tmp_path) -> None:
    import transformers as tf

    from relax.weights.checksum import state_checksums
    from tests.megatron_workers import spawn

    path = tmp_path / "hf"
    flags = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
             "--update-weight-buffer-size", "262144"]  # 256 KiB buckets: several shards
    sums = spawn(_save_hf, 4, 4, flags, str(path))["sums"]
    assert (path / "config.json").exists() and (path / "tokenizer.json").exists()
    assert (path / "model.safetensors.index.json").exists()  # one shard per export bucket
    reloaded = tf.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16)
    assert state_checksums(reloaded.state_dict().items()) == sums


def _critic_steps(rank: int, world: int, flags: list[str]) -> dict:
    """Two PPO rollouts; the critic's weights and metrics afterwards (every rank holds the whole critic)."""
    backend = _backend("small-qwen3", world, ["--advantage-estimator", "ppo", *flags])
    backend.critic.model.double()  # in place (its AdamW keeps the parameters): why, see tests/test_data_parallel.py
    metrics = [backend.train_rollout(varied_samples(10 + step), step) for step in range(2)]
    return {"critic": {k: v.detach().clone() for k, v in backend.critic.model.state_dict().items()},
            "value_loss": [m["train/value_loss"] for m in metrics]}


@pytest.mark.parametrize("world, flags", [(2, []), (2, ["--tensor-model-parallel-size", "2"]),
                                          (2, ["--pipeline-model-parallel-size", "2"])], ids=["dp2", "tp2", "pp2"])
def test_ppo_critic_is_the_same_under_every_layout(world: int, flags: list[str]) -> None:
    """The critic, replicated on every rank, runs its data-parallel rank's micro-batches and sums gradients over the
    data-parallel group. Tensor / pipeline peers (one data-parallel rank) compute it whole, bitwise as one rank
    does. At DP 2 each rank sums two of the four micro-batches' gradients and the all-reduce adds the two partial
    sums, ((g1 + g3) + (g2 + g4)) where one rank adds ((g1 + g2) + g3) + g4: equal up to rounding, so the critic
    runs in float64 here, as tests/test_data_parallel.py's models do (a dropped micro-batch or a missing reduce is
    off by a quarter of the gradient)."""
    from tests.megatron_workers import spawn

    one = spawn(_critic_steps, 1, 1, [])
    got = spawn(_critic_steps, world, world, flags)
    if "--tensor-model-parallel-size" in flags or "--pipeline-model-parallel-size" in flags:
        assert got["value_loss"] == one["value_loss"]
        assert all(torch.equal(got["critic"][k], v) for k, v in one["critic"].items())
        return
    assert got["value_loss"] == pytest.approx(one["value_loss"], rel=1e-6)  # reduced in float32
    for name, want in one["critic"].items():
        diff = float((got["critic"][name] - want).abs().max())
        assert diff < 1e-10, f"{name}: max |DP2 - DP1| = {diff}"
    assert one["value_loss"][1] != one["value_loss"][0]  # the critic moved: the comparison proves something
