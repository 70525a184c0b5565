"""Resolve megatron-bridge 0.6.2's closure for ``--megatron-to-hf-mode bridge`` and write ci/wheelhouse/bridge.lock.

    ~/.pyenv/versions/3.12.1/bin/python ci/wheelhouse/bridge_closure.py --cache /tmp/brcache [--lock PATH]
    python3 ci/wheelhouse/bridge_closure.py patch megatron_bridge-0.6.2-py3-none-any.whl OUT_DIR   (build_bridge.sh)

What relax runs of megatron-bridge: ``from megatron.bridge import AutoBridge``, ``AutoBridge.from_hf_pretrained``
(a local directory), ``load_hf_weights`` and ``export_hf_weights`` on relax's own GPTModel (local spec, no
Transformer Engine) for a dense Qwen3 (relax/backends/megatron/bridge.py). megatron-bridge 0.6.2 declares 30
requirements for its recipes, training loop, loggers, diffusion and vision models; that path imports four
distributions the GPU machine lacks or holds in another version: megatron-bridge itself, transformers 5.12.1
(it needs ``<=5.12.1``; the machine has 5.17.0), tokenizers 0.22.2 (transformers 5.12.1 needs ``<=0.23.0``, the
machine has 0.23.2 and 0.23.0 was never released as final) and omegaconf 2.4.0 (megatron/bridge/models/config.py).
megatron-core comes from relax's own wheelhouse (0.19.2, /tmp/site). They go into a --target dir of their own,
/tmp/bridgesite (install_bridge.sh), put first on PYTHONPATH only for the process that runs bridge mode.

Checked on the CPU box (Python 3.12, the lock plus the GPU machine's packages it uses, each in a --target dir):
ci/bridge_run.py --device cpu loads small-qwen3 through AutoBridge into relax's GPTModel (equal bit for bit to
relax's raw loader) and exports it back bit for bit, and only the GPU machine's packages are imported besides the
lock's; ci/wheelhouse/import_sweep.py megatron.bridge finds the EXCLUDED packages missing only in modules that path
never imports (recipes, training, data, loggers, diffusion and vision models).

One source edit (PATCHES, applied by build_bridge.sh through repack.py): megatron/bridge/peft/lora_layers.py
imports Transformer Engine unconditionally, and AutoBridge imports it (model_bridge -> peft_bridge ->
canonical_lora -> lora_layers). TE is megatron-bridge's ``te`` extra, has no binary wheel for the pytorch part
(transformer-engine-torch is built from source against the installed torch and CUDA) and relax's model does not use
it; the edit makes that import optional (``te = None``, annotations postponed), which only LoRA on TE layers would
touch. A stub ``transformer_engine`` package instead would make megatron-core believe TE is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from closure import HERE, Closure, machine_packages, main, norm  # noqa: E402, F401

ROOTS = ["megatron-bridge==0.6.2"]
UNDECLARED: dict[str, str] = {}
# name -> why AutoBridge's load / export of a dense Qwen3 never imports it (not followed further). The other
# declared requirements are on the GPU machine (torch, accelerate, peft, einops, tensorboard, rich, six, regex,
# pyyaml, tqdm, timm, typing-extensions; the lock header lists them) or carried (transformers, omegaconf).
EXCLUDED: dict[str, str] = {
    "diffusers": "the diffusion models' bridges (megatron/bridge/diffusion/conversion/wan, flux); "
                 "megatron.bridge.diffusion.models registers only bridges that import it under a guard",
    "datasets": "training data (megatron/bridge/data: gpt_sft, hf sources, mimo); conversion never loads data",
    "hydra-core": "the recipes' config overrides (training/utils/omegaconf_utils.py); not on the conversion path",
    "wandb": "a training logger (training/utils), imported inside functions when --wandb is configured",
    "mlflow": "a training logger, imported inside functions",
    "comet-ml": "a training logger, imported inside a function",
    "nvidia-resiliency-ext": "fault tolerance / in-process restart of megatron-bridge's pretrain loop "
                             "(training/pretrain.py, inprocess_restart.py); relax runs its own loop",
    "qwen-vl-utils": "Qwen-VL image/video preprocessing, imported inside a function of the VL models",
    "open-clip-torch": "vision towers of multimodal models; megatron.bridge imports it nowhere at module level",
    "flash-linear-attention": "linear-attention kernels (Qwen3-Next / GDN-style models); imported nowhere in "
                              "megatron.bridge itself, megatron-core guards its own import",
    "flashinfer-python": "inference kernels; megatron.bridge imports flashinfer nowhere",
    "flashinfer-cubin": "prebuilt cubins for flashinfer (hundreds of MB), which is left out",
    "fast-hadamard-transform": "a CUDA extension (source only) for Hadamard-rotated quantization; imported nowhere "
                               "in megatron.bridge, megatron-core guards its own import",
    "mistral-common": "Mistral tokenizers; megatron.bridge imports it nowhere (transformers only inside its "
                      "Mistral tokenizer); it caps numpy<2.4 on Python 3.12, which would shadow the machine's 2.5.2",
}
PROVIDED = {"megatron-core": "0.19.2"}  # ci/wheelhouse/build.sh (relax's .whl), installed into /tmp/site
LORA = "megatron/bridge/peft/lora_layers.py"
PATCHES: dict[str, dict[str, list[tuple[str, str]]]] = {
    "megatron_bridge-0.6.2-": {LORA: [
        ("import math\n", "from __future__ import annotations  # relax: te.ops annotations need no TE\n\nimport math\n"),
        ("import transformer_engine.pytorch as te\n",
         "try:  # relax: Transformer Engine is optional (only LoRA on TE layers uses it)\n"
         "    import transformer_engine.pytorch as te\n"
         "except ImportError:\n"
         "    te = None\n"),
    ]},
}
SPEC = Closure(
    "megatron-bridge 0.6.2", "bridge_closure.py", "build_bridge.sh", ROOTS, UNDECLARED, EXCLUDED, PROVIDED,
    notes=["", "build_bridge.sh repacks megatron-bridge with one edit (bridge_closure.py PATCHES):",
           f"{LORA} imports Transformer Engine only if it is installed",
           "(TE has no binary wheel for its torch part; relax's model does not use it)."])


def patch(wheel: Path, out_dir: Path) -> Path:
    """``wheel`` repacked with its PATCHES (a wheel without any is refused: nothing to do)."""
    from repack import repack

    edits = next((e for prefix, e in PATCHES.items() if wheel.name.startswith(prefix)), None)
    if edits is None:
        raise SystemExit(f"bridge_closure: no patch for {wheel.name}")
    return repack(wheel, out_dir, [], edits)


if __name__ == "__main__":
    if sys.argv[1:2] == ["patch"]:
        patch(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        main(SPEC, HERE / "bridge.lock", __doc__.splitlines()[0])
