"""Cross-flag rules and derived defaults, applied once after parsing (seed 000 semantics).

`resolve_and_validate` fills every "When None, equals --x" default and raises `ConfigError`
(one line) on inconsistent values. It runs after the not-supported gate, so the implied
values it sets (``--colocate`` -> offload) never trip that gate.
"""

from __future__ import annotations

import re
from argparse import Namespace
from collections.abc import Set

from relax.backends.embedded.runner_choice import check_runner_flags
from relax.backends.megatron import memory_flags
from relax.backends.megatron.checks import check_train_backend_args
from relax.utils.flag_table import FLAGS_BY_NAME
from relax.utils.flag_types import ConfigError


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def needs_reference_model(args: Namespace) -> bool:
    """KL loss or KL reward shaping need the frozen reference model (in the trainer, or the `reference` service)."""
    return bool(args.use_kl_loss or args.kl_loss_coef or args.kl_coef)


def _positive(args: Namespace, *dests: str) -> None:
    for dest in dests:
        value = getattr(args, dest)
        if value is not None and value < 1:
            raise ConfigError(f"{_flag(dest)} must be >= 1, got {value}")


def _batch_sizes(args: Namespace, explicit: Set[str]) -> None:
    _positive(args, "rollout_batch_size", "n_samples_per_prompt", "micro_batch_size", "global_batch_size",
              "num_steps_per_rollout", "num_rollout", "num_epoch", "save_interval")
    total = args.rollout_batch_size * args.n_samples_per_prompt
    if args.num_steps_per_rollout is not None:
        if total % args.num_steps_per_rollout:
            raise ConfigError(
                f"--num-steps-per-rollout {args.num_steps_per_rollout} must divide rollout-batch-size x "
                f"n-samples-per-prompt = {args.rollout_batch_size} x {args.n_samples_per_prompt} = {total}"
            )
        derived = total // args.num_steps_per_rollout
        if "global_batch_size" in explicit and args.global_batch_size != derived:
            raise ConfigError(
                f"--global-batch-size {args.global_batch_size} conflicts with --num-steps-per-rollout "
                f"{args.num_steps_per_rollout}, which sets it to {total} / {args.num_steps_per_rollout} = {derived}"
            )
        args.global_batch_size = derived
    if args.global_batch_size is None:
        args.global_batch_size = total
    if total % args.global_batch_size:
        raise ConfigError(
            f"--global-batch-size {args.global_batch_size} must divide rollout-batch-size x n-samples-per-prompt "
            f"= {args.rollout_batch_size} x {args.n_samples_per_prompt} = {total}"
        )
    if not args.use_dynamic_batch_size and args.global_batch_size % args.micro_batch_size:
        raise ConfigError(
            f"--micro-batch-size {args.micro_batch_size} must divide --global-batch-size {args.global_batch_size}"
        )
    if args.over_sampling_batch_size is not None and args.over_sampling_batch_size < args.rollout_batch_size:
        raise ConfigError(
            f"--over-sampling-batch-size {args.over_sampling_batch_size} must be >= "
            f"--rollout-batch-size {args.rollout_batch_size}"
        )


def _train_loop(args: Namespace) -> None:
    """Dynamic batching, chunked log-probs and the parameter-freezing regexes."""
    _positive(args, "max_tokens_per_gpu", "log_probs_max_tokens_per_gpu", "num_iters_per_train_update",
              "distributed_timeout_minutes")
    if not args.use_dynamic_batch_size:
        for dest in ("max_tokens_per_gpu", "log_probs_max_tokens_per_gpu"):
            if getattr(args, dest) is not None:
                raise ConfigError(f"{_flag(dest)} has no effect without --use-dynamic-batch-size")
    if args.log_probs_chunk_size != -1 and args.log_probs_chunk_size < 1:
        raise ConfigError(f"--log-probs-chunk-size must be -1 (off) or >= 1, got {args.log_probs_chunk_size}")
    for dest in ("only_train_params_name_list", "freeze_params_name_list"):
        for pattern in getattr(args, dest) or ():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{_flag(dest)}: {pattern!r} is not a valid regex ({exc})") from None


def _requirements(args: Namespace) -> None:
    """Flags that need, or exclude, other flags."""
    if args.kl_coef and args.kl_loss_coef:
        raise ConfigError(
            f"--kl-coef {args.kl_coef} and --kl-loss-coef {args.kl_loss_coef} are mutually exclusive "
            "(reward shaping vs loss term): set one of them to 0"
        )
    if args.only_train_params_name_list and args.freeze_params_name_list:
        raise ConfigError("--only-train-params-name-list and --freeze-params-name-list cannot be used together")
    if args.loss_type == "custom_loss" and not args.custom_loss_function_path:
        raise ConfigError("--loss-type custom_loss requires --custom-loss-function-path")
    if args.use_opd and not args.opd_type:
        raise ConfigError("--use-opd requires --opd-type (sglang or megatron)")
    if args.opd_type == "megatron" and not args.opd_teacher_load:
        raise ConfigError("--opd-type megatron requires --opd-teacher-load")
    if args.use_opd and args.opd_type == "sglang":
        _opd_sglang(args)
    if args.rm_type == "remote_rm" and not args.rm_url:
        raise ConfigError("--rm-type remote_rm requires --rm-url")
    if args.use_dynamic_batch_size and not args.max_tokens_per_gpu:
        raise ConfigError("--use-dynamic-batch-size requires --max-tokens-per-gpu")
    check_train_backend_args(args)
    check_runner_flags(args)


def _opd_sglang(args: Namespace) -> None:
    """The teacher server: --rm-url (a running server) or --opd-teacher-load (the run launches one)."""
    if bool(args.rm_url) == bool(args.opd_teacher_load):
        raise ConfigError("--opd-type sglang needs exactly one of --rm-url (a running teacher server, e.g. "
                          "http://HOST:PORT/generate) or --opd-teacher-load (relax starts an embedded teacher server)")
    if args.rm_url and args.rm_type == "remote_rm":
        raise ConfigError("--opd-type sglang and --rm-type remote_rm both use --rm-url: use --opd-teacher-load "
                          "for the teacher, or a --custom-rm-path reward")
    if args.train_backend == "megatron":
        raise ConfigError("not supported yet: --opd-type sglang with --train-backend megatron "
                          "(use --opd-type megatron, or --train-backend torch)")


def _megatron_memory(args: Namespace) -> None:
    """Activation recompute and optimizer CPU offload (relax/backends/megatron/memory_flags.py).

    Megatron flags: refused with the torch backend. Combinations megatron-core's `TransformerConfig`
    / `OptimizerConfig` reject, or would silently ignore, are refused here, naming the flags.
    """
    given = memory_flags.memory_flags_given(args)
    if given and args.train_backend != "megatron":
        raise ConfigError(f"not supported yet: {_flag(given[0])} with --train-backend {args.train_backend} "
                          "(a Megatron flag: use --train-backend megatron)")
    _positive(args, "recompute_num_layers")
    granularity = args.recompute_granularity
    knobs = [dest for dest in ("recompute_method", "recompute_num_layers") if getattr(args, dest) is not None]
    if granularity is None and knobs:
        raise ConfigError(f"{_flag(knobs[0])} has no effect without --recompute-granularity full")
    if granularity == "selective" and knobs:
        raise ConfigError(f"{_flag(knobs[0])} has no effect with --recompute-granularity selective (it recomputes "
                          "core attention in every layer; megatron-core requires recompute_num_layers None)")
    if granularity == "full":
        if args.recompute_method is None:
            raise ConfigError("--recompute-granularity full needs --recompute-method (uniform or block)")
        if args.recompute_num_layers is None:
            raise ConfigError("--recompute-granularity full needs --recompute-num-layers N (uniform: layers per "
                              "checkpointed chunk; block: how many layers are checkpointed)")
    if args.overlap_cpu_optimizer_d2h_h2d and not args.optimizer_cpu_offload:
        raise ConfigError("--overlap-cpu-optimizer-d2h-h2d has no effect without --optimizer-cpu-offload")
    if args.optimizer_cpu_offload and not args.use_precision_aware_optimizer:
        raise ConfigError("--optimizer-cpu-offload needs --use-precision-aware-optimizer (Megatron-LM's rule: the "
                          "hybrid device optimizer runs on that code path)")
    if args.use_precision_aware_optimizer:
        if not args.use_distributed_optimizer:
            raise ConfigError("--use-precision-aware-optimizer needs --use-distributed-optimizer "
                              "(megatron-core's OptimizerConfig)")
        if not args.optimizer_cpu_offload and not memory_flags.te_available():
            raise ConfigError("not supported yet: --use-precision-aware-optimizer without --optimizer-cpu-offload "
                              "(megatron-core runs it on Transformer Engine's FusedAdam; transformer_engine is "
                              "not installed)")
    if args.optimizer_cpu_offload and args.save and not args.no_save_optim:
        raise ConfigError("not supported yet: saving the --optimizer-cpu-offload optimizer state (distributed "
                          "optimizer shards): pass --no-save-optim with --save")


def _partial_rollout(args: Namespace) -> None:
    """--partial-rollout's companions, and the modes it does not combine with yet."""
    if not args.partial_rollout:
        for dest in ("partial_rollout_max_aborted_count", "mask_offpolicy_in_partial_rollout"):
            if getattr(args, dest) not in (None, False):
                raise ConfigError(f"{_flag(dest)} has no effect without --partial-rollout")
        return
    if args.partial_rollout_max_aborted_count is not None and args.partial_rollout_max_aborted_count < 0:
        raise ConfigError(f"--partial-rollout-max-aborted-count must be >= 0, got {args.partial_rollout_max_aborted_count}")
    # fully-async: a weight sync may land inside a request, so its tokens' versions are unknown;
    # the other two send requests the partial-rollout loop cannot abort or resend
    for dest in ("fully_async", "use_fault_tolerance", "custom_generate_function_path"):
        if getattr(args, dest):
            raise ConfigError(f"not supported yet: --partial-rollout with {_flag(dest)}")


def _transfer_queue(args: Namespace) -> None:
    """The TransferQueue knobs configure the fully-async loop's storage units (relax/core/transfer_queue.py)."""
    _positive(args, "num_data_storage_units")
    if args.max_staleness < 0:
        raise ConfigError(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if not args.fully_async:
        for dest in ("num_data_storage_units", "polling_mode"):
            if getattr(args, dest) != FLAGS_BY_NAME[dest.replace("_", "-")].default:
                raise ConfigError(f"{_flag(dest)} has no effect without --fully-async "
                                  "(the colocate loop hands samples to the trainer directly)")


def _weight_sync(args: Namespace) -> None:
    """``--weight-sync-transport`` rules the per-sync choice cannot fix later (relax/weights/sync.py)."""
    transport = args.weight_sync_transport
    if transport in ("cuda-ipc", "broadcast") and args.use_fault_tolerance:
        raise ConfigError(f"--weight-sync-transport {transport} with --use-fault-tolerance: restarted engines are "
                          "resynced from host copies, so fault tolerance syncs through the object store (use auto)")
    if transport != "cuda-ipc":
        return
    if not args.colocate:
        raise ConfigError("--weight-sync-transport cuda-ipc needs --colocate (the engines must share the trainer's GPU)")
    if args.offload_train:
        raise ConfigError("--weight-sync-transport cuda-ipc with --offload-train: the trainer's weights are on the "
                          "host at sync time (use auto: it picks object-store then)")


def _qkv_format(args: Namespace, explicit: Set[str]) -> None:
    """Both backends build right-padded (bshd) micro-batches; the seed's default thd resolves to it."""
    if args.qkv_format != "thd":
        return
    if "qkv_format" in explicit:
        raise ConfigError("not supported yet: --qkv-format thd (packed sequences: megatron-core runs packed_seq_params "
                          "only in Transformer Engine's attention; relax builds padded micro-batches, --qkv-format bshd)")
    args.qkv_format = "bshd"


def _services(args: Namespace) -> None:
    """Seed 004's fully-async service roles in --resource and their --ref-actor-config (relax/core/services.py).

    A ``reference`` role without a reference model is refused, not ignored: it would hold a model
    nobody asks. ``advantages`` takes its inputs from the other services, so it needs them.
    """
    from relax.distributed.placement import parse_ref_actor_config, service_roles

    roles = service_roles(args)
    if args.ref_actor_config is not None and not roles & {"reference", "actor_fwd"}:
        raise ConfigError("--ref-actor-config needs a reference or actor_fwd role in --resource")
    if not roles:
        return
    args.ref_actor_config = parse_ref_actor_config(args.ref_actor_config)
    named = ", ".join(sorted(roles))
    if not args.fully_async:
        raise ConfigError(f"--resource roles {named} need --fully-async (the services feed the fully-async trainer)")
    if args.train_backend != "torch":
        raise ConfigError(f"not supported yet: --resource roles {named} with --train-backend {args.train_backend} "
                          "(the services build a forward-only copy of the torch backend; a Megatron one, sharded "
                          "by --ref-actor-config's tensor parallelism, is not built)")
    needs_ref = needs_reference_model(args)
    if "reference" in roles and not needs_ref:
        raise ConfigError("--resource role 'reference' needs a reference model (--use-kl-loss, --kl-loss-coef or "
                          "--kl-coef); without one nothing uses it")
    if "advantages" not in roles:
        return
    if args.advantage_estimator == "ppo":
        raise ConfigError("not supported yet: --resource role 'advantages' with --advantage-estimator ppo "
                          "(the critic's values live in the trainer)")
    if args.use_opd and args.opd_type == "megatron":
        raise ConfigError("not supported yet: --resource role 'advantages' with --opd-type megatron "
                          "(the teacher's log-probs live in the trainer)")
    if "actor_fwd" not in roles:
        raise ConfigError("--resource role 'advantages' needs 'actor_fwd' (it takes the old log-probs from it)")
    if needs_ref and "reference" not in roles:
        raise ConfigError("--resource role 'advantages' needs 'reference' with a KL term (it takes the reference "
                          "log-probs from it)")


def _offload(args: Namespace) -> None:
    """Seed 000: ``--colocate`` sets both offloads; otherwise an unset one equals ``--offload``.

    Two cases have nothing that can be offloaded, and refuse an explicit request (``--colocate``'s
    implied offload resolves to False there): ``--fully-async`` (rollout and training run at the same
    time, so neither side is ever idle) and, for ``--offload-train``, ``--train-backend megatron``
    (its DDP grad buffers and distributed-optimizer shards are not moved yet).
    """
    requested = {dest: getattr(args, dest) is True for dest in ("offload", "offload_train", "offload_rollout")}
    if args.fully_async:
        for dest, on in requested.items():
            if on:
                raise ConfigError(f"{_flag(dest)} has no effect with --fully-async (rollout and training overlap)")
        args.offload_train = args.offload_rollout = False
        return
    megatron = args.train_backend == "megatron"
    if megatron and (requested["offload"] or requested["offload_train"]):
        raise ConfigError("not supported yet: --offload-train with --train-backend megatron")
    if args.colocate:
        args.offload_train = not megatron
        args.offload_rollout = True
    if args.offload_train is None:
        args.offload_train = args.offload
    if args.offload_rollout is None:
        args.offload_rollout = args.offload


def _implied(args: Namespace) -> None:
    """Flags that switch other flags on (seed: 'Automatically enables / sets ...')."""
    _offload(args)
    if args.load_debug_rollout_data:
        args.debug_train_only = True
    if args.use_rollout_routing_replay:
        args.use_routing_replay = True


def _when_none(args: Namespace) -> None:
    """'When None, equals --x' defaults from the seed's tables."""
    pairs = {
        "eps_clip_high": "eps_clip",
        "critic_lr": "lr",
        "critic_load": "load",
        "eval_input_key": "input_key",
        "eval_max_context_len": "rollout_max_context_len",
        "eval_reward_key": "reward_key",
        "eval_function_path": "rollout_function_path",
        "log_probs_max_tokens_per_gpu": "max_tokens_per_gpu",
    }
    for dest, source in pairs.items():
        if getattr(args, dest) is None:
            setattr(args, dest, getattr(args, source))
    if args.rollout_max_response_len is None:
        args.rollout_max_response_len = 128  # SGLang's own default for max_new_tokens


def resolve_and_validate(args: Namespace, explicit: Set[str] = frozenset()) -> None:
    """Fill derived defaults and check cross-flag rules. ``explicit``: dests given on the command line."""
    _implied(args)
    debug = args.debug_rollout_only or args.debug_train_only
    if not args.prompt_data and not args.debug_train_only:
        raise ConfigError("--prompt-data is required")
    if args.num_rollout is None and args.num_epoch is None and not debug:
        raise ConfigError("set --num-rollout or --num-epoch")
    _batch_sizes(args, explicit)
    _requirements(args)
    _train_loop(args)
    _megatron_memory(args)
    _partial_rollout(args)
    _transfer_queue(args)
    _weight_sync(args)
    _qkv_format(args, explicit)
    _services(args)
    _when_none(args)
