"""The PPO critic: the policy's transformer body plus a scalar value head, in plain torch.

The value of response token t is read at the same position whose logits predict token t
(the state before emitting it), so values line up with log-probs and advantages.

Both backends use it. The torch backend's data-parallel ranks each hold a copy; the Megatron backend gives
every rank of its TP x PP x EP x DP grid a full copy (the critic is not sharded), which runs the micro-batches of
its data-parallel rank and reduces its gradients over the data-parallel group, so ranks that share a
data-parallel rank (tensor / pipeline peers) compute and keep the same critic.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from relax.algorithms.critic import critic_lr_at, value_loss
from relax.algorithms.reducers import merge_metrics
from relax.backends.optimizer import build_optimizer, load_saved_state
from relax.backends.torch.batch import RolloutTensors, build_model_inputs
from relax.backends.torch.data_parallel import DataParallel
from relax.checkpoint_io import HostFile, to_host
from relax.models import build_model

if TYPE_CHECKING:
    from relax.backends.config import TrainerConfig


class ValueModel(torch.nn.Module):
    def __init__(self, causal_lm: torch.nn.Module):
        super().__init__()
        self.body = causal_lm.get_decoder()
        self.head = torch.nn.Linear(causal_lm.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)  # the head computes in its own dtype


class Critic:
    """Owns the value model and its optimizer; trained alongside the actor in each optimizer step.

    ``dp``: the actor's data-parallel group; the critic runs the same micro-batches as the actor on each rank.
    """

    def __init__(self, cfg: TrainerConfig, device: torch.device, pad_id: int, dp: DataParallel):
        self.cfg, self.device, self.pad_id, self.algo, self.dp = cfg, device, pad_id, cfg.algo, dp
        self.model = ValueModel(build_model(cfg.hf_checkpoint, dtype=torch.float32, seed=cfg.seed)).to(device)
        self.optimizer = build_optimizer(self.model.parameters(), cfg, cfg.algo.critic_lr)  # --optimizer's kind

    def _values(self, batch: RolloutTensors, sl: slice) -> torch.Tensor:
        inputs = build_model_inputs(batch.samples[sl], batch.loss_mask.shape[1], self.pad_id, self.device)
        values = self.model(inputs.input_ids, inputs.attention_mask)
        return values.gather(1, inputs.logit_positions) * inputs.valid.to(values.dtype)

    @torch.no_grad()
    def values(self, batch: RolloutTensors, slices: list[slice]) -> torch.Tensor:
        out = torch.zeros_like(batch.loss_mask)
        for sl in slices:
            out[sl] = self._values(batch, sl).cpu()
        return self.dp.sum_rows(out)

    def train_step(self, batch: RolloutTensors, gsl: slice, micro: list[slice], old_values, returns, step: int):
        for group in self.optimizer.param_groups:
            group["lr"] = critic_lr_at(step, self.algo)
        num_samples = gsl.stop - gsl.start
        num_tokens = int(batch.loss_mask[gsl].sum().item())
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = {}
        for sl in micro:
            values = self._values(batch, sl)
            loss, m = value_loss(self.algo, values=values, old_values=old_values[sl].to(self.device),
                                 returns=returns[sl].to(self.device), loss_mask=batch.loss_mask[sl].to(self.device),
                                 num_global_samples=num_samples, num_global_tokens=num_tokens)
            loss.backward()
            sums = merge_metrics(sums, {k: v.detach().cpu() for k, v in m.items()})
        out = {k: float(v) for k, v in self.dp.merge_metrics(sums).items()}
        self.dp.reduce_gradients(self.model.parameters())
        out["critic_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad))
        self.optimizer.step()
        out["critic_lr"] = self.optimizer.param_groups[0]["lr"]
        return out

    def checkpoint_files(self, directory: Path, *, save_optimizer: bool) -> list[HostFile]:
        """Host copies of the value model (and its optimizer's state) for ``directory`` (relax/checkpoint_io.py)."""
        files = [HostFile(directory / "critic.safetensors", "safetensors", to_host(self.model.state_dict()))]
        if save_optimizer:
            files.append(HostFile(directory / "critic_optimizer.pt", "torch", to_host(self.optimizer.state_dict())))
        return files

    def load(self, directory: Path) -> None:
        """The value model (and its optimizer's state, when saved) from ``directory``."""
        from safetensors.torch import load_file

        if not (directory / "critic.safetensors").exists():
            raise ValueError(f"checkpoint {directory} has no critic.safetensors: it was not saved with "
                             "--advantage-estimator ppo")
        self.model.load_state_dict(load_file(str(directory / "critic.safetensors")))
        if (directory / "critic_optimizer.pt").exists():
            load_saved_state(self.optimizer, directory / "critic_optimizer.pt")
