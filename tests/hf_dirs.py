"""Small real-architecture HF checkpoints for tests, built offline: a byte-level BPE tokenizer trained
with `tokenizers` on the test's own text (ChatML chat template, ``<|im_end|>`` as EOS) and a random-init
Qwen2 / Llama / Qwen3 model of a few hundred thousand parameters, saved as a user would bring them."""

from __future__ import annotations

from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6)


def arithmetic_corpus() -> list[str]:
    """Chat turns of the running-sum task (examples/arith_env), so the BPE learns its pieces."""
    lines = []
    for a in range(10):
        for b in range(10):
            lines.append(f"<|im_start|>user\n{a}+{b}=<|im_end|>\n<|im_start|>assistant\n{(a + b) % 10}<|im_end|>\n"
                         f"<|im_start|>user\n+{(a * 3 + b) % 10}=<|im_end|>\n")
    return lines * 3


def bpe_tokenizer(corpus: list[str], vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  clean_up_tokenization_spaces=False, model_max_length=512)
    tok.chat_template = CHATML
    return tok


def config(family: str, tokenizer, **overrides):
    import transformers as tf

    classes = {"qwen2": tf.Qwen2Config, "llama": tf.LlamaConfig, "qwen3": tf.Qwen3Config}
    extra = {"head_dim": 16} if family != "qwen2" else {}
    return classes[family](**{**SIZES, **extra, "vocab_size": len(tokenizer), "tie_word_embeddings": family != "llama",
                              "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
                              "bos_token_id": None, **overrides})


def hf_dir(path: Path, family: str, tokenizer, *, seed: int = 0, model=None, **overrides) -> Path:
    """Save a random-init ``family`` model (or ``model``) and ``tokenizer`` to ``path`` as an HF checkpoint."""
    import torch
    import transformers as tf

    if model is None:
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(config(family, tokenizer, **overrides))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def model_flags(family: str, tokenizer) -> list[str]:
    """The Megatron architecture flags (seed 001's scripts/models/*.sh shape) that describe `config`."""
    flags = ["--swiglu", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
             "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16",
             "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm",
             "--norm-epsilon", "1e-6", "--rotary-base", "10000", "--vocab-size", str(len(tokenizer)),
             "--make-vocab-size-divisible-by", "1", "--max-position-embeddings", "512"]
    if family == "qwen2":
        flags.append("--add-qkv-bias")
    if family == "qwen3":
        flags.append("--qk-layernorm")
    if family == "llama":
        flags.append("--untie-embeddings-and-output-weights")
    return flags
