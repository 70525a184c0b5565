"""How the default rollout and evaluation put a sample's prompt into SGLang's ``/generate``: token ids, or text.

Without ``--use-slime-router`` a request carries the prompt's token ids (``input_ids``, tokenized once by the
data layer). With it, the request carries the prompt text (``Sample.prompt``) and the engine tokenizes it, as
SGLang does for ``text`` (slime's SlimeRouter routes by text); the request asks ``return_prompt_token_ids`` and
the sample's prompt tokens become the ids the engine answers with, so what is trained on is exactly what the
engine ran (prompt ids + ``output_ids``, one log-prob per output id), in the same shape as a token request.
"""

from __future__ import annotations

from typing import Any

from relax.data.multimodal import one_pad_per_image
from relax.utils.types import Sample


def prompt_fields(sample: Sample, text: bool, image_pad_id: int | None = None) -> dict[str, Any]:
    """The request's prompt fields for ``sample``; ``text``: ``--use-slime-router``. A sample with images sends each
    as one ``<|image_pad|>`` (``image_pad_id``: the tokenizer's; None sends the tokens as they are), the form SGLang
    takes (relax/data/multimodal.py `one_pad_per_image`); the engine expands it back to the sample's tokens."""
    images = isinstance(sample.multimodal_inputs, dict) and bool(sample.multimodal_inputs.get("image_data"))
    if not text:
        if images and image_pad_id is not None:
            return {"input_ids": one_pad_per_image(sample.tokens, image_pad_id,
                                                   len(sample.tokens) - sample.response_length)}
        return {"input_ids": list(sample.tokens)}
    if not isinstance(sample.prompt, str) or not sample.prompt:
        raise ValueError(f"--use-slime-router sends each prompt as text; sample {sample.index} has a "
                         f"{type(sample.prompt).__name__ if sample.prompt else 'empty'} prompt (a data source must "
                         "set Sample.prompt to the prompt text)")
    if sample.response_length:
        raise ValueError(f"--use-slime-router sends each prompt as text; sample {sample.index} already has "
                         f"{sample.response_length} response tokens, which text cannot carry")
    if images:  # --multimodal-keys is refused with --use-slime-router; a custom data source can still get here
        raise ValueError(f"--use-slime-router sends each prompt as text; sample {sample.index} has images, which go "
                         "as token ids (not supported yet: media prompts with --use-slime-router)")
    return {"text": sample.prompt, "return_prompt_token_ids": True}


def take_prompt_ids(sample: Sample, response: dict[str, Any], text: bool) -> None:
    """With ``text``, the sample's prompt tokens become the engine's (SGLang's ``prompt_token_ids``); a sample that
    already had response tokens was sent as its token ids (partial rollout's resume), and keeps them."""
    if not text or sample.response_length:
        return
    ids = response.get("prompt_token_ids")
    if not isinstance(ids, list) or not ids:
        raise ValueError(f"--use-slime-router: the engine's answer for sample {sample.index} has no prompt_token_ids "
                         "(SGLang returns them for return_prompt_token_ids=true)")
    sample.tokens = list(ids)
