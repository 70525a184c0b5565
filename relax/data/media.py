"""Turning one media value of a dataset row into a decoded image, offline and with one-line errors.

A row may give an image as a local path (absolute, or relative to the prompt file), a ``data:`` URI or bare
base64 text, raw bytes, or a HF-datasets image struct ``{"bytes": ..., "path": ...}`` (parquet). An
``http(s)://`` URL is refused at once: runs are offline, and a fetch would hang or fail far from the row.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

from relax.data.dataset import DataError

URL_SCHEMES = ("http://", "https://", "ftp://", "s3://", "gs://")


def _open_bytes(data: bytes, where: str, what: str):
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{where}: {what} is not an image PIL can read ({type(exc).__name__})") from None
    return img.convert("RGB")


def _b64(text: str) -> bytes | None:
    """The bytes of a ``data:...;base64,`` URI or of long bare base64 text; None for anything else."""
    if text.startswith("data:"):
        head, _, body = text.partition(",")
        if ";base64" not in head:
            return None
        text = body
    elif len(text) < 64 or "/" in text[:8] and Path(text).suffix:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def media_bytes(value: Any, where: str, base_dir: Path | None, what: str, forms: str) -> tuple[bytes, str]:
    """The raw bytes of one row's media value, and how an error about them names them (``what``: image, audio).

    Bytes; a HF-datasets ``{"bytes", "path"}`` struct (its bytes raw, or base64 text as a struct written to JSON
    carries them; else its path); a ``data:`` URI or bare base64 text; a local path, relative to ``base_dir``. A URL
    is refused (runs are offline); anything else is refused with ``forms`` ("an image must be ...")."""
    if isinstance(value, bytes | bytearray):
        return bytes(value), f"the {what} bytes"
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        data = value.get("bytes")
        if isinstance(data, str):
            data = _b64(data)
            if data is None:
                raise DataError(f"{where}: the {what} struct's bytes are text but not base64")
        if data:
            return bytes(data), f"the {what} struct's bytes"
        return media_bytes(value.get("path"), where, base_dir, what, forms)
    if not isinstance(value, str) or not value:
        raise DataError(f"{where}: {forms}, got {type(value).__name__}")
    if value.lower().startswith(URL_SCHEMES):
        raise DataError(f"{where}: {what} URL {value} cannot be fetched: runs are offline (download it and give the "
                        "local path)")
    data = _b64(value)
    if data is not None:
        return data, f"the base64 {what}"
    path = Path(value)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise DataError(f"{where}: {what} file not found: {path}")
    return path.read_bytes(), f"{what} file {path}"


def load_image(value: Any, where: str, base_dir: Path | None = None):
    """An RGB ``PIL.Image`` from one row's image value (module docstring); ``where`` names the row."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    data, name = media_bytes(value, where, base_dir, "image", "an image must be a path, a URL, base64 text or bytes")
    return _open_bytes(data, where, name)


def encode_png(image) -> str:
    """An image as a ``data:image/png;base64,`` URI: how SGLang's ``image_data`` carries an image over HTTP."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
