"""`HFRunner` for a vision-language model (Qwen2.5-VL, and Qwen2.5-Omni's thinker with its audio tower): the
vision and audio towers run in prefill, and every row keeps its multimodal-RoPE offset for decode.

Qwen2.5-VL numbers an image's tokens by (t, h, w) grid position, so the positions after an image run
behind the token count: ``delta = last position + 1 - tokens``. Prefill takes ``[3, B, L]`` positions from
the model's own ``get_rope_index`` over the left-padded rows (the trainer computes them the same way over
right-padded rows: relax/backends/torch/vision_inputs.py); a decoded token sits at ``tokens so far + delta``
on all three axes, as HF's own generation does. Text-only rows have delta 0.
"""

from __future__ import annotations

from typing import Any

import torch

from relax.backends.embedded.runners import HFRunner, _left_padded
from relax.backends.torch.omni_inputs import audio_batch
from relax.backends.torch.vision_inputs import VisionBatch, embed_with_media, media_masks, mrope_positions


def _cat(rows: list[dict[str, Any]], key: str, device: torch.device) -> torch.Tensor | None:
    """The rows' ``key`` tensors in one, on the model's device (image_data.py decodes media on the host)."""
    parts = [m[key] for m in rows if m.get(key) is not None]
    return torch.cat(parts).to(device) if parts else None


class VisionRunner(HFRunner):
    def reset(self) -> None:
        super().reset()
        self.deltas: torch.Tensor | None = None  # [B] rope offset per row

    def prefill(self, prompts: list[list[int]], media: list[dict[str, Any] | None] | None = None) -> torch.Tensor:
        """``media[i]``: row ``i``'s media tensors (relax/backends/embedded/image_data.py), or None for text only."""
        ids, mask = _left_padded(prompts, self.pad_id, self.device)
        rows = [m for m in (media or []) if m]
        if not rows:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            deltas = torch.zeros(len(prompts), dtype=torch.long, device=self.device)
        else:
            per_row = list(media or [None] * len(prompts))
            vision = VisionBatch(*(_cat(rows, k, self.device) for k in ("pixel_values", "image_grid_thw")), mask.bool(),
                                 *(_cat(rows, k, self.device) for k in ("pixel_values_videos", "video_grid_thw",
                                                                        "second_per_grid_ts")),
                                 audio_batch(per_row, self.device), per_row)
            image_mask, video_mask = media_masks(self.model, ids, None)  # a prompt's pads (image_data.py counts them)
            positions, deltas = mrope_positions(self.model, ids, mask, vision, image_mask, video_mask)
            embeds = embed_with_media(self.model, ids, vision, image_mask, video_mask)
            out = self.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=True)
        self._merge(out.past_key_values, mask)
        self.deltas = deltas if self.deltas is None else torch.cat([self.deltas, deltas])
        return out.logits[:, -1, :]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = self.mask.sum(-1, keepdim=True) + self.deltas[:, None]
        mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=-1)
        out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True)
        self.mask = mask
        return out.logits[:, -1, :]

    def keep(self, indices: list[int]) -> list[int]:
        if len(indices) != self.rows and indices:
            self.deltas = self.deltas[torch.tensor(indices, dtype=torch.long, device=self.deltas.device)]
        return super().keep(indices)
