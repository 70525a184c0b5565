"""Per-token policy-gradient losses, registered by estimator, and the per-micro-batch loss.

With r = exp(log_probs - behaviour_log_probs) (behaviour = old log-probs, or rollout log-probs
with ``--use-rollout-logprobs``) and advantage A, per token:

- ppo clip (grpo, rloo, reinforce++, ppo, OPD): pg = max(-A r, -A clip(r, 1 - eps_clip,
  1 + eps_clip_high)); dual clip (``--eps-clip-c`` c > 1): for A < 0, pg = min(pg, -c A).
- gspo: the same clipped objective on the sequence ratio s = exp(mean_t log r), with GSPO-token
  gradients (value s, gradient s * grad log p_t), so the sample-mean reduction gives GSPO exactly.
- sapo: soft gate instead of a clip: pg = -A * (4 / tau) * sigmoid(tau (r - 1)), tau =
  ``--sapo-tau-pos`` for A > 0 else ``--sapo-tau-neg`` (gate slope 1 at r = 1, as in the paper).
- cispo: pg = -sg(clip(r, 1 - eps_clip, 1 + eps_clip_high)) * A * log_probs (clipped IS weight
  under stop-gradient: no token's gradient is ever zeroed).

Then pg *= TIS/ICEPOP weights (``--use-tis``) and the OPSM mask; loss = pg_loss
- entropy_coef * entropy + kl_loss_coef * KL(log_probs || ref) (``--use-kl-loss``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from relax.algorithms.kl import kl_estimate
from relax.algorithms.opsm import opsm_mask
from relax.algorithms.reducers import REDUCER_SIGNATURE, Reducer, default_reducer
from relax.algorithms.tis import TIS_SIGNATURE, mismatch_metrics, truncated_is
from relax.utils.plugins import culprit, load_function, wrong_answer

if TYPE_CHECKING:
    from relax.algorithms.config import AlgorithmConfig

# (cfg, log_probs, behaviour_log_probs, advantages, loss_mask) -> (per-token loss, per-token clip indicator)
PgLoss = Callable[..., tuple[torch.Tensor, torch.Tensor]]
CUSTOM_LOSS_SIGNATURE = "custom_loss(args, batch: dict[str, Tensor | None], reducer) -> (loss, metrics)"


def _clipped(cfg: AlgorithmConfig, ratio, advantages) -> tuple[torch.Tensor, torch.Tensor]:
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).to(ratio.dtype)
    if cfg.eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * cfg.eps_clip_c), loss)
    return loss, clipfrac


def ppo_clip(cfg: AlgorithmConfig, log_probs, behaviour, advantages, mask):
    return _clipped(cfg, torch.exp(log_probs - behaviour), advantages)


def gspo(cfg: AlgorithmConfig, log_probs, behaviour, advantages, mask):
    n = mask.sum(-1, keepdim=True).clamp(min=1)
    seq_log_ratio = ((log_probs - behaviour) * mask).sum(-1, keepdim=True) / n
    token_log_ratio = seq_log_ratio.detach() + log_probs - log_probs.detach()
    return _clipped(cfg, torch.exp(token_log_ratio), advantages)


def sapo(cfg: AlgorithmConfig, log_probs, behaviour, advantages, mask):
    ratio = torch.exp(log_probs - behaviour)
    tau = torch.where(
        advantages > 0, torch.full_like(ratio, cfg.sapo_tau_pos), torch.full_like(ratio, cfg.sapo_tau_neg)
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    return -advantages * gate, torch.zeros_like(ratio)


def cispo(cfg: AlgorithmConfig, log_probs, behaviour, advantages, mask):
    ratio = torch.exp(log_probs - behaviour).detach()
    weight = ratio.clamp(1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip_high)
    return -weight * advantages * log_probs, (weight != ratio).to(ratio.dtype)


PG_LOSSES: dict[str, PgLoss] = {"gspo": gspo, "sapo": sapo, "cispo": cispo}


def _custom_loss(cfg: AlgorithmConfig, batch: dict, reduce: Reducer):
    path = cfg.custom_loss_function_path
    fn = load_function(path, flag="--custom-loss-function-path", signature=CUSTOM_LOSS_SIGNATURE, min_args=3)
    with culprit("--custom-loss-function-path", path):
        out = fn(cfg.args, batch, reduce)
    if not (isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[0], torch.Tensor)
            and isinstance(out[1], dict)):
        raise wrong_answer(f"--custom-loss-function-path {path}", out,
                           f"{CUSTOM_LOSS_SIGNATURE} with loss a Tensor and metrics a dict")
    return out[0], out[1]


def _pg_reducer(
    cfg: AlgorithmConfig, default: Reducer, mask, num_global_samples: int, num_global_tokens: int
):
    if not cfg.custom_pg_loss_reducer_function_path:
        return default
    path, flag = cfg.custom_pg_loss_reducer_function_path, "--custom-pg-loss-reducer-function-path"
    fn = load_function(path, flag=flag, signature=REDUCER_SIGNATURE, min_args=4)

    def reduce(x):
        with culprit(flag, path):
            out = fn(x, mask, num_global_samples, num_global_tokens)
        if not isinstance(out, torch.Tensor):
            raise wrong_answer(f"{flag} {path}", out, REDUCER_SIGNATURE)
        return out

    return reduce


def _tis(cfg: AlgorithmConfig, old_log_probs, rollout_log_probs, mask):
    if rollout_log_probs is None:
        raise ValueError("--use-tis needs rollout log-probs (the engine must return log-probs)")
    if not cfg.custom_tis_function_path:
        weights, metrics = truncated_is(old_log_probs, rollout_log_probs, mask, low=cfg.tis_clip_low, high=cfg.tis_clip)
        return weights.detach(), metrics
    path, flag = cfg.custom_tis_function_path, "--custom-tis-function-path"
    fn = load_function(path, flag=flag, signature=TIS_SIGNATURE, min_args=3)
    with culprit(flag, path):
        out = fn(old_log_probs, rollout_log_probs, mask, low=cfg.tis_clip_low, high=cfg.tis_clip)
    if not (isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[0], torch.Tensor)
            and out[0].shape == old_log_probs.shape and isinstance(out[1], dict)):
        raise wrong_answer(f"{flag} {path}", out, f"{TIS_SIGNATURE} with weights a Tensor of the log-probs' shape "
                                                  f"{tuple(old_log_probs.shape)} and metrics a dict")
    return out[0].detach(), out[1]


def policy_loss(
    cfg: AlgorithmConfig,
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ref_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_global_samples: int,
    num_global_tokens: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the global loss, and its share of every metric (see reducers.py).

    ``ppo_kl`` is the mean of ``old_log_probs - log_probs`` (trainer-side drift, 0 at the first
    step of a rollout). Extremes (``*_max``/``*_min``) merge by max/min: use reducers.merge_metrics.
    """
    reduce = default_reducer(cfg.calculate_per_token_loss, loss_mask, num_global_samples, num_global_tokens)
    if cfg.loss_type == "custom_loss":
        batch = dict(
            log_probs=log_probs,
            old_log_probs=old_log_probs,
            advantages=advantages,
            loss_mask=loss_mask,
            ref_log_probs=ref_log_probs,
            rollout_log_probs=rollout_log_probs,
            entropy=entropy,
        )
        return _custom_loss(cfg, batch, reduce)
    behaviour = rollout_log_probs if cfg.use_rollout_logprobs else old_log_probs
    if behaviour is None:
        raise ValueError("--use-rollout-logprobs needs rollout log-probs")
    pg, clipfrac = PG_LOSSES.get(cfg.advantage_estimator, ppo_clip)(
        cfg, log_probs, behaviour, advantages, loss_mask
    )
    per_token: dict[str, torch.Tensor] = {"pg_clipfrac": clipfrac, "ppo_kl": old_log_probs - log_probs}
    extremes: dict[str, torch.Tensor] = {}
    if cfg.use_tis:
        weights, tis_metrics = _tis(cfg, old_log_probs, rollout_log_probs, loss_mask)
        pg = pg * weights
        per_token.update(tis_metrics)
    if cfg.use_opsm:
        keep = opsm_mask(log_probs, behaviour, advantages, loss_mask, cfg.opsm_delta)
        pg = pg * keep
        per_token["opsm_maskfrac"] = 1.0 - keep
    if cfg.get_mismatch_metrics:
        if rollout_log_probs is None:
            raise ValueError("--get-mismatch-metrics needs rollout log-probs")
        mismatch, extremes = mismatch_metrics(old_log_probs, rollout_log_probs, loss_mask)
        per_token.update(mismatch)
    loss = pg_loss = _pg_reducer(cfg, reduce, loss_mask, num_global_samples, num_global_tokens)(pg)
    metrics = {"pg_loss": pg_loss}
    if entropy is not None:
        metrics["entropy"] = entropy_mean = reduce(entropy)
        loss = loss - cfg.entropy_coef * entropy_mean
    if cfg.use_kl_loss and ref_log_probs is None:
        raise ValueError("--use-kl-loss needs reference log-probs (load a reference model)")
    if ref_log_probs is not None:
        ratio = torch.exp(log_probs - behaviour) if cfg.use_unbiased_kl else None
        metrics["kl_loss"] = kl_loss = reduce(kl_estimate(log_probs, ref_log_probs, cfg.kl_loss_type, ratio))
        if cfg.use_kl_loss:
            loss = loss + cfg.kl_loss_coef * kl_loss
    metrics["loss"] = loss
    metrics.update({k: reduce(v) for k, v in per_token.items()})
    return loss, {k: v.detach() for k, v in {**metrics, **extremes}.items()}
