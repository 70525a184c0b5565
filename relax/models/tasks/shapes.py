"""``colorshape``: the VLM quickstart's visual task. A 32x32 picture holds one filled 16x16 square of one of four
colours at a random place on white; the question asks for the square's colour, answered with one letter
(``r g b y``).

The answer is in the pixels only (the text is the same for every row), so a reward above chance (0.25 once
the model answers with the four letters) needs the vision tower's features. A second, decoy shape (a circle
of another colour) made the task too slow for a CPU quickstart: 100 steps stayed at chance.
Rows are deterministic (a fixed RNG), the images inline as PNG data URIs so the file is self-contained.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

COLOURS = {"r": (220, 30, 30), "g": (30, 190, 30), "b": (30, 60, 220), "y": (230, 210, 20)}
QUESTION = "<image>Colour of the square?"
SIZE = 32


def draw(square: str, rng: random.Random):
    """The picture: a 16x16 square of colour ``square`` somewhere on a white 32x32 canvas."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    x, y = rng.randint(0, SIZE - 16), rng.randint(0, SIZE - 16)
    ImageDraw.Draw(img).rectangle([x, y, x + 15, y + 15], fill=COLOURS[square])
    return img


def colorshape() -> Iterator[dict[str, object]]:
    from relax.data.media import encode_png

    rng = random.Random(44)
    for i in range(48):
        square = "rgby"[i % 4]
        yield {"prompt": QUESTION, "images": [encode_png(draw(square, rng))], "label": square}
