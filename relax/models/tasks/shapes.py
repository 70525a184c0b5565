"""``colorshape``: the VLM quickstart's visual task. A 32x32 picture holds a filled square and a filled circle
of two different colours; the question asks for the square's colour, answered with one letter (``r g b y``).

The answer is in the pixels only (the text is the same for every row), so reward above chance needs the
vision tower's features; the model must also tell the square from the circle, whose colour is a decoy.
Rows are deterministic (a fixed RNG), the images inline as PNG data URIs so the file is self-contained.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

COLOURS = {"r": (220, 30, 30), "g": (30, 190, 30), "b": (30, 60, 220), "y": (230, 210, 20)}
QUESTION = "<image>Colour of the square?"
SIZE = 32


def draw(square: str, circle: str, rng: random.Random):
    """The picture: a 10px square and a 10px circle in different quadrant pairs, on white."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    pen = ImageDraw.Draw(img)
    left = rng.random() < 0.5  # the square on the left half, the circle on the right, or the other way
    sx, cx = (rng.randint(1, 5), rng.randint(17, 21)) if left else (rng.randint(17, 21), rng.randint(1, 5))
    sy, cy = rng.randint(1, 21), rng.randint(1, 21)
    pen.rectangle([sx, sy, sx + 9, sy + 9], fill=COLOURS[square])
    pen.ellipse([cx, cy, cx + 9, cy + 9], fill=COLOURS[circle])
    return img


def colorshape() -> Iterator[dict[str, object]]:
    from relax.data.media import encode_png

    rng = random.Random(44)
    for i in range(48):
        square = "rgby"[i % 4]
        circle = rng.choice([c for c in "rgby" if c != square])
        yield {"prompt": QUESTION, "images": [encode_png(draw(square, circle, rng))], "label": square}
