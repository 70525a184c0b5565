"""Record what the one-GPU Megatron backend computes for fixed configs: log-probs, metrics and weights per step.

    PYTHONPATH=<tree whose relax/ to run>:$SITE python3 tests/gpu/megatron_reference_run.py --out FILE.pt

Run as a script (not ``-m``), so ``relax`` comes from the first PYTHONPATH entry: the current tree, or
a checkout of an older commit (tests/gpu/test_megatron_reproduces_base.py compares the two). It uses
only what every version of the backend offers (``MegatronTrainBackend(TrainerConfig.from_args(args), "cuda")``,
``_log_probs_no_grad``, ``train_rollout``, ``checksums``) and the GPU tests' samples (tests/gpu/samples.py, beside it).
"""

from __future__ import annotations

import argparse

import torch
from samples import varied_samples  # tests/gpu/samples.py: this script's directory is first on sys.path

from relax.backends.config import TrainerConfig

CONFIGS = {
    "plain": [],
    "distopt-kl-dynamic": ["--use-distributed-optimizer", "--use-kl-loss", "--kl-loss-coef", "0.01",
                           "--use-dynamic-batch-size", "--max-tokens-per-gpu", "48"],
}
STEPS = 3


def run(flags: list[str]) -> dict:
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.backends.torch.batch import build_rollout_tensors
    from relax.utils.arguments import parse_args

    args = parse_args(["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", "small-qwen3",
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "1", "--micro-batch-size", "2", "--lr", "3e-3", *flags])
    backend = MegatronTrainBackend(TrainerConfig.from_args(args), "cuda")
    record: dict = {"log_probs": [], "metrics": []}
    for step in range(STEPS):
        batch = varied_samples(step)
        record["log_probs"].append(backend._log_probs_no_grad(backend.model, build_rollout_tensors(batch)).clone())
        record["metrics"].append(backend.train_rollout(batch, step))
    record["checksums"] = backend.checksums()
    del backend
    torch.cuda.empty_cache()
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = parser.parse_args().out
    import relax

    torch.save({"relax": relax.__file__, "configs": {name: run(flags) for name, flags in CONFIGS.items()}}, out)


if __name__ == "__main__":
    main()
