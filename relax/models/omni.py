"""The offline audio-capable model: a tiny Qwen2.5-Omni thinker (text, images, videos and audio in; text out).

Qwen2.5-Omni's thinker is Qwen2.5-VL's vision tower and multimodal-RoPE language model plus a Whisper-style
audio tower: log-mel frames (``num_mel_bins`` per frame, one frame per 160 samples) go through two
convolutions (the second of stride 2) and a stride-2 average pool, so a clip of ``F`` frames becomes
``((F - 1) // 2 + 1 - 2) // 2 + 1`` audio tokens (`audio_token_count`). The text marks a clip as
``<|audio_bos|>`` + one ``<|AUDIO|>`` per token + ``<|audio_eos|>``; a video whose sound goes in with it
(``--use-audio-in-video``) as ``<|vision_start|><|audio_bos|>`` + its video and audio tokens interleaved in
``seconds_per_chunk`` chunks + ``<|audio_eos|><|vision_end|>`` (relax/data/multimodal.py writes both, as
Qwen2_5OmniProcessor does). The tokenizer is ``char-omni``: char-vl plus the three audio tokens
(relax/models/tokenizer.py). The log-mel features come from transformers' WhisperFeatureExtractor shaped
from the audio tower's config (relax/data/audio.py), so a preset and a checkpoint directory agree.
"""

from __future__ import annotations

from typing import Any

from relax.models.tokenizer import (
    AUDIO_END_ID,
    AUDIO_PAD_ID,
    AUDIO_START_ID,
    IMAGE_PAD_ID,
    OMNI_VOCAB_SIZE,
    VIDEO_PAD_ID,
    VISION_START_ID,
)
from relax.models.vision import TINY_VISION, TINY_VL_TEXT

# The tiny audio tower: 16 mel bins, one 32-wide encoder layer, projected to the language model's width.
TINY_AUDIO = dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                  output_dim=64, max_source_positions=1500, n_window=100)
TINY_OMNI = dict(text_config=dict(TINY_VL_TEXT, vocab_size=OMNI_VOCAB_SIZE), vision_config=TINY_VISION,
                 audio_config=TINY_AUDIO, image_token_index=IMAGE_PAD_ID, video_token_index=VIDEO_PAD_ID,
                 audio_token_index=AUDIO_PAD_ID, vision_start_token_id=VISION_START_ID,
                 audio_start_token_id=AUDIO_START_ID, audio_end_token_id=AUDIO_END_ID, tie_word_embeddings=True)


def is_audio_config(config: Any) -> bool:
    """Whether an HF config is an audio-capable model's (it carries an audio tower config)."""
    return getattr(config, "audio_config", None) is not None


def mel_bins(config: Any) -> int:
    """Log-mel bins per frame that the model's audio tower takes."""
    return int(config.audio_config.num_mel_bins)


def audio_token_count(frames: int) -> int:
    """``<|AUDIO|>`` tokens of a clip of ``frames`` log-mel frames (the tower's conv stride and pooling)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def audio_chunking(config: Any) -> tuple[float, float]:
    """(position ids per second, seconds per chunk): how a video's sound interleaves with its frames."""
    return float(config.position_id_per_seconds), float(config.seconds_per_chunk)
