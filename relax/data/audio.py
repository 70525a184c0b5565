"""Turning one audio value of a dataset row (or of SGLang's ``audio_data``) into the model's log-mel features.

A row may give a clip as a local WAV path (absolute, or relative to the prompt file), a ``data:audio/wav;base64,``
URI or bare base64 text, raw WAV bytes, a HF-datasets audio struct ``{"bytes": ..., "path": ...}`` (parquet),
or a decoded ``{"array": [...], "sampling_rate": R}``. An ``http(s)://`` URL is refused at once (runs are
offline). WAV is read with the standard library's `wave` (PCM, 8/16/24/32-bit, any channel count, averaged
to mono); another container (mp3, flac, ...) is refused in one line naming it.

The clip is resampled to ``--audio-sample-rate`` (default 16000) by band-limited sinc interpolation
(`resample`: the polyphase windowed-sinc method of torchaudio's ``resample`` and of ``scipy.signal.resample_poly``,
written here on torch: with scipy installed, transformers' modeling import pulls in scipy.optimize, +0.28 CPU-s in
every trainer and engine process), then quantized to 16-bit PCM: the engine receives it as a
WAV data URI (SGLang's ``audio_data``) and decodes exactly the samples the trainer's features were computed from.
The features are transformers' WhisperFeatureExtractor (what Qwen2_5OmniProcessor runs) at that rate: 400-sample
windows every 160 samples, padded to its 30 s window as the processor pads, keeping the clip's own frames.
"""

from __future__ import annotations

import base64
import functools
import io
import math
import warnings
import wave
from pathlib import Path
from typing import Any

import numpy as np

from relax.data.dataset import DataError
from relax.data.media import media_bytes

HOP_LENGTH, N_FFT, CHUNK_SECONDS = 160, 400, 30  # Whisper's feature extractor (Qwen2.5-Omni's)
_OTHER_CONTAINERS = {b"ID3": "mp3", b"\xff\xfb": "mp3", b"fLaC": "flac", b"OggS": "ogg"}


def _read_wav(data: bytes, where: str, what: str) -> tuple[np.ndarray, int]:
    for magic, kind in _OTHER_CONTAINERS.items():
        if data.startswith(magic):
            raise DataError(f"{where}: {what} is {kind} audio; only WAV (PCM) is decoded here: convert it to WAV")
    try:
        with wave.open(io.BytesIO(data)) as w:
            rate, channels, width, frames = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
            raw = w.readframes(frames)
    except (wave.Error, EOFError, ValueError) as exc:
        raise DataError(f"{where}: {what} is not a PCM WAV file the wave module can read ({exc})") from None
    if rate <= 0 or not raw:
        raise DataError(f"{where}: {what} holds no audio samples")
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8).astype(np.float32) / 8388608.0
    else:
        dtype = {2: np.int16, 4: np.int32}[width]
        x = np.frombuffer(raw, dtype).astype(np.float32) / float(2 ** (8 * width - 1))
    return x.reshape(-1, channels).mean(axis=1), rate


def load_audio(value: Any, where: str, base_dir: Path | None = None) -> tuple[np.ndarray, int]:
    """(mono float32 samples in [-1, 1], their rate) of one row's audio value (module docstring)."""
    if isinstance(value, dict) and "array" in value:
        rate = value.get("sampling_rate")
        if not isinstance(rate, int) or rate <= 0:
            raise DataError(f"{where}: an audio array needs a positive integer sampling_rate, got {rate!r}")
        x = np.asarray(value["array"], dtype=np.float32)
        if x.ndim != 1 or not x.size:
            raise DataError(f"{where}: an audio array must be a non-empty list of samples")
        return x, rate
    data, name = media_bytes(value, where, base_dir, "audio", "an audio clip must be a WAV path, base64 text, bytes "
                             'or {"array", "sampling_rate"}')
    return _read_wav(data, where, name)


@functools.lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int, width: int = 6, rolloff: float = 0.99):
    """The ``new`` polyphase filters of a windowed-sinc low-pass at ``rolloff`` times the lower Nyquist rate."""
    import torch

    cutoff = min(orig, new) * rolloff
    half = math.ceil(width * orig / cutoff)
    t = torch.arange(-half, half + orig, dtype=torch.float64)[None, :] / orig
    t = t + torch.arange(0, -new, -1, dtype=torch.float64)[:, None] / new
    t = (t * cutoff).clamp(-width, width)
    window = torch.cos(t * math.pi / width / 2) ** 2  # Hann
    t = t * math.pi
    kernel = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t) * window * (cutoff / orig)
    return kernel.to(torch.float32)[:, None, :], half


def resample(x: np.ndarray, orig: int, new: int) -> np.ndarray:
    """``x`` at rate ``orig`` resampled to ``new`` (band-limited; the identity when the rates agree)."""
    if orig == new:
        return x.astype(np.float32, copy=False)
    import torch

    g = math.gcd(orig, new)
    o, n = orig // g, new // g
    kernel, half = _sinc_kernel(o, n)
    wave_ = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None, None, :]
    padded = torch.nn.functional.pad(wave_, (half, half + o))
    out = torch.nn.functional.conv1d(padded, kernel, stride=o)  # [1, n, blocks]
    out = out.transpose(1, 2).reshape(-1)[: math.ceil(n * len(x) / o)]
    return out.numpy()


def quantize(x: np.ndarray) -> np.ndarray:
    """Samples rounded to 16-bit PCM (what a WAV carries), as float32 again."""
    return np.round(np.clip(x, -1.0, 32767 / 32768) * 32768.0).astype(np.int16).astype(np.float32) / 32768.0


def encode_wav(x: np.ndarray, rate: int) -> str:
    """A mono clip as a ``data:audio/wav;base64,`` URI of 16-bit PCM (SGLang's ``audio_data`` over HTTP)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.round(x * 32768.0).astype("<i2").tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@functools.lru_cache(maxsize=8)
def _extractor(bins: int, rate: int):
    from transformers import WhisperFeatureExtractor

    with warnings.catch_warnings():  # few mel bins at a low rate leave a filter empty: harmless
        warnings.simplefilter("ignore", UserWarning)
        return WhisperFeatureExtractor(feature_size=bins, sampling_rate=rate, hop_length=HOP_LENGTH,
                                       chunk_length=CHUNK_SECONDS, n_fft=N_FFT)


def log_mel(x: np.ndarray, rate: int, bins: int) -> np.ndarray:
    """``[bins, frames]`` log-mel features of a clip at ``rate``, as Qwen2_5OmniProcessor computes them (padded to
    the extractor's window, then its own frames kept); a clip longer than the window is cut to it."""
    fe = _extractor(bins, rate)
    out = fe([x], sampling_rate=rate, padding="max_length", truncation=True, return_attention_mask=True,
             return_tensors="np")
    frames = int(out["attention_mask"][0].sum())
    return np.ascontiguousarray(out["input_features"][0, :, :frames], dtype=np.float32)


def prepare_clip(value: Any, where: str, base_dir: Path | None, rate: int, bins: int) -> tuple[str, np.ndarray]:
    """(the clip as a WAV data URI at ``rate``, its ``[bins, frames]`` features): one row's audio value."""
    x, orig = load_audio(value, where, base_dir)
    x = quantize(resample(x, orig, rate))
    if len(x) < N_FFT:
        raise DataError(f"{where}: audio of {len(x)} samples at {rate} Hz is shorter than one {N_FFT}-sample window")
    return encode_wav(x, rate), log_mel(x, rate, bins)
