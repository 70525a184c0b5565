"""Cross-flag rules and derived defaults, applied once after parsing (seed 000 semantics).

`resolve_and_validate` fills every "When None, equals --x" default and checks the cross-flag
rules. Every rule is a small function ``rule(args, p)`` that reports each problem it finds with
``p.add(...)`` (one line each) and carries on, so a launch reports all its problems at once;
checks kept elsewhere that raise `ConfigError` run through ``p.run(check, args)``. It runs after
the not-supported gate, so the implied values it sets (``--colocate`` -> offload) never trip that gate.
"""

from __future__ import annotations

import functools
import re
from argparse import Namespace
from collections.abc import Callable, Set

from relax.backends.embedded.config import EmbeddedEngineConfig
from relax.backends.embedded.runner_choice import check_runner_flags
from relax.backends.megatron import memory_flags
from relax.backends.megatron.checks import check_train_backend
from relax.backends.megatron.megatron_config import MegatronConfig
from relax.engine.rewards.genrm_config import GenRMConfig
from relax.metrics.clearml_logger import ClearMLConfig
from relax.observability.memory import MemoryConfig
from relax.observability.notify import NotifyConfig
from relax.utils import debug_modes
from relax.utils.flag_table import FLAGS_BY_NAME
from relax.utils.flag_types import Problems


def rule(fn: Callable[..., None]) -> Callable[..., None]:
    """A rule ``fn(args, p, ...)`` reports into ``p``; called without a collector (``fn(args)``, as a
    test may) it raises its problems itself, one ConfigError."""

    @functools.wraps(fn)
    def run(args: Namespace, p: Problems | None = None, *rest):
        if p is not None:
            return fn(args, p, *rest)
        own = Problems()
        fn(args, own, *rest)
        own.raise_if_any()

    return run


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def needs_reference_model(args: Namespace) -> bool:
    """KL loss or KL reward shaping need the frozen reference model (in the trainer, or the `reference` service)."""
    return bool(args.use_kl_loss or args.kl_loss_coef or args.kl_coef)


def _positive(args: Namespace, p: Problems, *dests: str) -> bool:
    """Report every given value below 1; True when all are fine."""
    ok = True
    for dest in dests:
        value = getattr(args, dest)
        if value is not None and value < 1:
            p.add(f"{_flag(dest)} must be >= 1, got {value}")
            ok = False
    return ok


@rule
def _batch_sizes(args: Namespace, p: Problems, explicit: Set[str]) -> None:
    if not _positive(args, p, "rollout_batch_size", "n_samples_per_prompt", "micro_batch_size", "global_batch_size",
                     "num_steps_per_rollout", "num_rollout", "num_epoch", "save_interval"):
        return  # the divisibility rules below need positive sizes
    total = args.rollout_batch_size * args.n_samples_per_prompt
    if args.num_steps_per_rollout is not None:
        if total % args.num_steps_per_rollout:
            p.add(f"--num-steps-per-rollout {args.num_steps_per_rollout} must divide rollout-batch-size x "
                  f"n-samples-per-prompt = {args.rollout_batch_size} x {args.n_samples_per_prompt} = {total}")
            return
        derived = total // args.num_steps_per_rollout
        if "global_batch_size" in explicit and args.global_batch_size != derived:
            p.add(f"--global-batch-size {args.global_batch_size} conflicts with --num-steps-per-rollout "
                  f"{args.num_steps_per_rollout}, which sets it to {total} / {args.num_steps_per_rollout} = {derived}")
        args.global_batch_size = derived
    if args.global_batch_size is None:
        args.global_batch_size = total
    if total % args.global_batch_size:
        p.add(f"--global-batch-size {args.global_batch_size} must divide rollout-batch-size x n-samples-per-prompt "
              f"= {args.rollout_batch_size} x {args.n_samples_per_prompt} = {total}")
    elif not args.use_dynamic_batch_size and args.global_batch_size % args.micro_batch_size:
        p.add(f"--micro-batch-size {args.micro_batch_size} must divide --global-batch-size {args.global_batch_size}")
    if args.over_sampling_batch_size is not None and args.over_sampling_batch_size < args.rollout_batch_size:
        p.add(f"--over-sampling-batch-size {args.over_sampling_batch_size} must be >= "
              f"--rollout-batch-size {args.rollout_batch_size}")


@rule
def _train_loop(args: Namespace, p: Problems) -> None:
    """Dynamic batching, chunked log-probs and the parameter-freezing regexes.

    ``--max-tokens-per-gpu`` without ``--use-dynamic-batch-size`` is how seed 004's template passes it
    (with ``--micro-batch-size 1``): it then budgets the no-grad log-prob passes (flag_table.py says how).
    """
    _positive(args, p, "max_tokens_per_gpu", "log_probs_max_tokens_per_gpu", "num_iters_per_train_update",
              "distributed_timeout_minutes")
    if args.log_probs_chunk_size != -1 and args.log_probs_chunk_size < 1:
        p.add(f"--log-probs-chunk-size must be -1 (off) or >= 1, got {args.log_probs_chunk_size}")
    if args.ref_update_interval is not None:
        if not needs_reference_model(args):
            p.add("--ref-update-interval needs a reference model (--use-kl-loss, --kl-loss-coef or --kl-coef); "
                  "without one there is nothing to update")
    if args.eval_min_new_tokens and args.rollout_backend == "embedded":
        p.add("not supported yet: --eval-min-new-tokens with --rollout-backend embedded (the embedded engine does "
              "not implement min_new_tokens; --rollout-backend sglang passes it)")
    if args.keep_old_actor and args.fully_async:
        p.add("not supported yet: --keep-old-actor with --fully-async (its rollouts mix weight versions; the copy "
              "holds one)")
    if args.keep_old_actor and (args.use_routing_replay or args.use_rollout_routing_replay):
        p.add("not supported yet: --keep-old-actor with routing replay (the replayed routing is the trainer "
              "model's, not the copy's)")
    if args.reset_optimizer_states and args.train_backend == "megatron" and args.optimizer_cpu_offload:
        p.add("not supported yet: --reset-optimizer-states with --optimizer-cpu-offload (megatron's hybrid "
              "optimizer keeps its own copies of the Adam state)")
    if args.lr_decay_style != "constant":
        if args.num_rollout is None:
            p.add(f"--lr-decay-style {args.lr_decay_style} needs --num-rollout (the decay's length)")
    if args.optimizer != "sgd" and args.sgd_momentum != FLAGS_BY_NAME["sgd-momentum"].default:
        p.add(f"--sgd-momentum applies to --optimizer sgd only (this run's is {args.optimizer})")
    if args.lr_decay_style == "WSD" and args.lr_wsd_decay_iters is None:
        p.add("--lr-decay-style WSD needs --lr-wsd-decay-iters (the optimizer steps of its anneal)")
    for name in ("lr-wsd-decay-iters", "lr-wsd-decay-style"):
        if args.lr_decay_style != "WSD" and getattr(args, name.replace("-", "_")) != FLAGS_BY_NAME[name].default:
            p.add(f"--{name} applies to --lr-decay-style WSD only (this run's is {args.lr_decay_style})")
    for dest in ("only_train_params_name_list", "freeze_params_name_list"):
        for pattern in getattr(args, dest) or ():
            try:
                re.compile(pattern)
            except re.error as exc:
                p.add(f"{_flag(dest)}: {pattern!r} is not a valid regex ({exc})")


@rule
def _routing_replay(args: Namespace, p: Problems) -> None:
    """Routing replay: the trainer's policy forwards (relax/backends/torch/routing_replay.py,
    relax/backends/megatron/routing_replay.py)."""
    if not (args.use_routing_replay or args.use_rollout_routing_replay):
        return
    flag = "--use-rollout-routing-replay" if args.use_rollout_routing_replay else "--use-routing-replay"
    from relax.distributed.resources import service_roles

    if "actor_fwd" in (p.run(service_roles, args.resource) or ()):
        p.add(f"not supported yet: {flag} with an 'actor_fwd' role in --resource (the old-log-prob forward "
              "runs outside the trainer)")
    if args.use_rollout_routing_replay and args.partial_rollout:
        p.add("not supported yet: --use-rollout-routing-replay with --partial-rollout (a resumed sample's "
              "routing would span several requests)")


@rule
def _true_on_policy(args: Namespace, p: Problems) -> None:
    """``--true-on-policy-mode``: the embedded engines report the torch trainer's own per-sample computation
    (relax/backends/embedded/train_identical.py), which the trainer repeats one unpadded sample at a time."""
    if not args.true_on_policy_mode:
        return
    if args.train_backend != "torch":
        p.add(f"not supported yet: --true-on-policy-mode with --train-backend {args.train_backend} (the engine's "
              "log-probs would have to come from Megatron's own forward; --train-backend torch has it)")
    if args.rollout_backend != "embedded" or args.rollout_external:
        p.add("not supported yet: --true-on-policy-mode with "
              + ("--rollout-external" if args.rollout_external else f"--rollout-backend {args.rollout_backend}")
              + " (only engines relax starts with --rollout-backend embedded recompute log-probs the trainer's way)")
    if args.micro_batch_size != 1:
        p.add(f"--true-on-policy-mode forwards one sample at a time: give --micro-batch-size 1, "
              f"not {args.micro_batch_size}")
    if args.use_dynamic_batch_size:
        p.add("--true-on-policy-mode forwards one sample at a time: drop --use-dynamic-batch-size")


@rule
def _requirements(args: Namespace, p: Problems) -> None:
    """Flags that need, or exclude, other flags."""
    if args.kl_coef and args.kl_loss_coef:
        p.add(f"--kl-coef {args.kl_coef} and --kl-loss-coef {args.kl_loss_coef} are mutually exclusive "
              "(reward shaping vs loss term): set one of them to 0")
    if args.only_train_params_name_list and args.freeze_params_name_list:
        p.add("--only-train-params-name-list and --freeze-params-name-list cannot be used together")
    if args.loss_type == "custom_loss" and not args.custom_loss_function_path:
        p.add("--loss-type custom_loss requires --custom-loss-function-path")
    if args.use_opd and not args.opd_type:
        p.add("--use-opd requires --opd-type (sglang or megatron)")
    if args.opd_type == "megatron" and not args.opd_teacher_load:
        p.add("--opd-type megatron requires --opd-teacher-load")
    if args.use_opd and args.opd_type == "sglang":
        _opd_sglang(args, p)
    if args.rm_type == "remote_rm" and not args.rm_url:
        p.add("--rm-type remote_rm requires --rm-url")
    if args.genrm_model_path and (args.custom_rm_path or args.group_rm):
        p.add("--genrm-model-path scores every sample with the GenRM judge: drop --custom-rm-path/--group-rm "
              "(a custom parse of the judgement is --genrm-engine-config reward_parser)")
    p.run(GenRMConfig.from_args, args, catch=(ValueError,))  # --genrm-*: the JSON keys, counts, template
    if args.distributed_backend == "gloo" and args.train_backend == "megatron" and args.device != "cpu":
        p.add("--distributed-backend gloo: not supported yet with --train-backend megatron on GPUs "
              "(megatron-core's groups need NCCL there)")
    if args.use_dynamic_batch_size and not args.max_tokens_per_gpu:
        p.add("--use-dynamic-batch-size requires --max-tokens-per-gpu")
    p.run(lambda: check_train_backend(MegatronConfig.from_args(args), args.resource))
    p.run(lambda: check_runner_flags(EmbeddedEngineConfig.from_args(args)))
    p.run(NotifyConfig.from_args, args, catch=(ValueError,))  # --notify-urls: apprise installed
    p.run(ClearMLConfig.from_args, args, catch=(ValueError,))  # --use-clearml: clearml installed
    p.run(MemoryConfig.from_args, args, catch=(ValueError,))  # --memory-recorder memray: memray installed


def _opd_sglang(args: Namespace, p: Problems) -> None:
    """The teacher server: --rm-url (a running server) or --opd-teacher-load (the run launches one)."""
    if bool(args.rm_url) == bool(args.opd_teacher_load):
        p.add("--opd-type sglang needs exactly one of --rm-url (a running teacher server, e.g. "
              "http://HOST:PORT/generate) or --opd-teacher-load (relax starts an embedded teacher server)")
    if args.rm_url and args.rm_type == "remote_rm":
        p.add("--opd-type sglang and --rm-type remote_rm both use --rm-url: use --opd-teacher-load "
              "for the teacher, or a --custom-rm-path reward")


@rule
def _megatron_memory(args: Namespace, p: Problems) -> None:
    """Activation recompute and optimizer CPU offload (relax/backends/megatron/memory_flags.py).

    Megatron flags: refused with the torch backend. Combinations megatron-core's `TransformerConfig`
    / `OptimizerConfig` reject, or would silently ignore, are refused here, naming the flags.
    """
    given = memory_flags.memory_flags_given(MegatronConfig.from_args(args))
    if given and args.train_backend != "megatron":
        for dest in given:
            p.add(f"not supported yet: {_flag(dest)} with --train-backend {args.train_backend} "
                  "(a Megatron flag: use --train-backend megatron)")
        return
    _positive(args, p, "recompute_num_layers")
    _recompute(args, p)
    if args.overlap_param_gather and not args.overlap_grad_reduce:
        p.add("--overlap-param-gather needs --overlap-grad-reduce (Megatron-LM's rule)")
    if args.optimizer == "sgd" and args.use_distributed_optimizer:
        p.add("--optimizer sgd with --use-distributed-optimizer: megatron-core's distributed optimizer holds Adam "
              "state only (its own rule); drop one of them")
    if args.overlap_param_gather and not args.use_distributed_optimizer:
        p.add("--overlap-param-gather needs --use-distributed-optimizer (only its sharded parameters are gathered)")
    if args.overlap_cpu_optimizer_d2h_h2d and not args.optimizer_cpu_offload:
        p.add("--overlap-cpu-optimizer-d2h-h2d has no effect without --optimizer-cpu-offload")
    if args.optimizer_cpu_offload and not args.use_precision_aware_optimizer:
        p.add("--optimizer-cpu-offload needs --use-precision-aware-optimizer (Megatron-LM's rule: the "
              "hybrid device optimizer runs on that code path)")
    if args.use_precision_aware_optimizer:
        if not args.use_distributed_optimizer:
            p.add("--use-precision-aware-optimizer needs --use-distributed-optimizer (megatron-core's OptimizerConfig)")
        if not args.optimizer_cpu_offload and not memory_flags.te_available():
            p.add("not supported yet: --use-precision-aware-optimizer without --optimizer-cpu-offload "
                  "(megatron-core runs it on Transformer Engine's FusedAdam; transformer_engine is not installed)")
    if args.optimizer_cpu_offload and args.save and not args.no_save_optim:
        p.add("not supported yet: saving the --optimizer-cpu-offload optimizer state (distributed "
              "optimizer shards): pass --no-save-optim with --save")


def _recompute(args: Namespace, p: Problems) -> None:
    granularity = args.recompute_granularity
    knobs = [dest for dest in ("recompute_method", "recompute_num_layers") if getattr(args, dest) is not None]
    if granularity is None and knobs:
        p.add(f"{_flag(knobs[0])} has no effect without --recompute-granularity full")
    if granularity == "selective" and knobs:
        p.add(f"{_flag(knobs[0])} has no effect with --recompute-granularity selective (it recomputes "
              "core attention in every layer; megatron-core requires recompute_num_layers None)")
    if granularity == "full":
        if args.recompute_method is None:
            p.add("--recompute-granularity full needs --recompute-method (uniform or block)")
        if args.recompute_num_layers is None:
            p.add("--recompute-granularity full needs --recompute-num-layers N (uniform: layers per "
                  "checkpointed chunk; block: how many layers are checkpointed)")


@rule
def _partial_rollout(args: Namespace, p: Problems) -> None:
    """--partial-rollout's companions, and the modes it does not combine with yet."""
    if not args.partial_rollout:
        for dest in ("partial_rollout_max_aborted_count", "mask_offpolicy_in_partial_rollout"):
            if getattr(args, dest) not in (None, False):
                p.add(f"{_flag(dest)} has no effect without --partial-rollout")
        return
    if args.partial_rollout_max_aborted_count is not None and args.partial_rollout_max_aborted_count < 0:
        p.add(f"--partial-rollout-max-aborted-count must be >= 0, got {args.partial_rollout_max_aborted_count}")
    # the other two send requests the partial-rollout loop cannot abort or resend
    for dest in ("use_fault_tolerance", "custom_generate_function_path"):
        if getattr(args, dest):
            p.add(f"not supported yet: --partial-rollout with {_flag(dest)}")


@rule
def _router(args: Namespace, p: Problems) -> None:
    """The text router's flags (relax/engine/router/): its middlewares need it. (With --partial-rollout a sample
    goes as text until it has response tokens, then as its token ids: relax/engine/rollout/partial_samples.py.)"""
    if args.slime_router_middleware_paths and not args.use_slime_router:
        p.add("--slime-router-middleware-paths needs --use-slime-router (the middlewares are the text router's)")
    if args.use_slime_router and args.multimodal_keys:
        p.add("not supported yet: --use-slime-router with --multimodal-keys (a media prompt is sent as token ids with "
              "one pad token per merged patch; its text form does not carry them)")


@rule
def _transfer_queue(args: Namespace, p: Problems) -> None:
    """The TransferQueue knobs configure the fully-async loop's storage units (relax/core/transfer_queue.py); their
    ranges are the flag table's (BOUNDS)."""
    if not args.fully_async:
        for dest in ("num_data_storage_units", "polling_mode"):
            if getattr(args, dest) != FLAGS_BY_NAME[dest.replace("_", "-")].default:
                p.add(f"{_flag(dest)} has no effect without --fully-async "
                      "(the colocate loop hands samples to the trainer directly)")


@rule
def _weight_sync(args: Namespace, p: Problems) -> None:
    """``--weight-sync-transport`` rules the per-sync choice cannot fix later (relax/weights/transports/)."""
    if args.weight_sync_transport != "tensor":
        return
    if args.rollout_external:
        p.add("--weight-sync-transport tensor with --rollout-external: a server the run did not start shares no "
              "memory with the trainer (use auto or distributed)")
    if args.device == "cuda" and not args.colocate:
        p.add("--weight-sync-transport tensor on GPUs needs --colocate (the engines must share the trainer's GPU); "
              "use auto or distributed")
    elif args.offload_train and args.device == "cuda" and args.rollout_backend != "embedded":
        p.add(f"--weight-sync-transport tensor with --offload-train and --rollout-backend {args.rollout_backend}: the "
              "trainer's weights are on the host at sync time, and only relax's engine maps a host buffer into its "
              "GPU (use auto: it picks distributed then)")


@rule
def _rollout_engines(args: Namespace, p: Problems) -> None:
    """``--rollout-backend``, ``--sglang-*``, ``--rollout-external*`` and ``--rollout-num-gpus-per-engine``
    (relax/core/engine_launchers.py, relax/backends/sglang/)."""
    _positive(args, p, "rollout_num_gpus_per_engine")
    sglang_flags = [f"--sglang-{k.replace('_', '-')}" for k in args.sglang_passthrough]
    if args.sglang_mem_fraction_static is not None:
        sglang_flags.insert(0, "--sglang-mem-fraction-static")
    if args.rollout_external:
        _external_engines(args, p, sglang_flags)
    elif args.rollout_external_engine_addrs:
        p.add("--rollout-external-engine-addrs has no effect without --rollout-external")
    elif args.rollout_backend == "sglang":
        _sglang_engines(args, p)
    elif sglang_flags:
        p.add(f"{sglang_flags[0]} configures SGLang servers: it needs --rollout-backend sglang")
    elif args.rollout_num_gpus_per_engine not in (None, 1):
        p.add(f"not supported yet: --rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine} with "
              "--rollout-backend embedded (the embedded engine has one tensor-parallel rank; use "
              "--rollout-backend sglang)")


def _external_engines(args: Namespace, p: Problems, sglang_flags: list[str]) -> None:
    from urllib.parse import urlsplit

    from relax.distributed.resources import rollout_role_given

    addrs = args.rollout_external_engine_addrs or []
    if not addrs:
        p.add("--rollout-external needs --rollout-external-engine-addrs HOST:PORT [HOST:PORT ...]")
    for addr in addrs:
        parts = urlsplit(addr if "://" in addr else f"http://{addr}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            p.add(f"--rollout-external-engine-addrs {addr!r}: expected HOST:PORT or http://HOST:PORT")
    if len(set(addrs)) != len(addrs):
        p.add("--rollout-external-engine-addrs names an engine twice")
    if sglang_flags:
        p.add(f"{sglang_flags[0]} with --rollout-external: the run does not start those servers (pass SGLang's "
              "flags where you start them)")
    if p.run(rollout_role_given, args.resource):
        p.add("--resource role 'rollout' with --rollout-external: the engines are the servers at "
              "--rollout-external-engine-addrs")


def _sglang_engines(args: Namespace, p: Problems) -> None:
    from relax.backends.sglang.launcher import INSTALL_HINT, sglang_available
    from relax.backends.sglang.server_args import server_arg_tokens

    if args.device == "cpu":
        p.add("--rollout-backend sglang runs SGLang servers on CUDA GPUs; --device cpu has none (use "
              "--rollout-backend embedded)")
    p.run(server_arg_tokens, args.sglang_passthrough)  # every --sglang-* flag is one of SGLang's options
    if not sglang_available():
        p.add(INSTALL_HINT)


def _qkv_format(args: Namespace, p: Problems, explicit: Set[str]) -> None:
    """Both backends build right-padded (bshd) micro-batches; the seed's default thd resolves to it."""
    if args.qkv_format != "thd":
        return
    if "qkv_format" in explicit:
        p.add("not supported yet: --qkv-format thd (packed sequences: megatron-core runs packed_seq_params only in "
              "Transformer Engine's attention; relax builds padded micro-batches, --qkv-format bshd)")
    args.qkv_format = "bshd"


@rule
def _services(args: Namespace, p: Problems) -> None:
    """Seed 004's fully-async service roles in --resource and their --ref-actor-config (relax/core/services.py).

    A ``reference`` role without a reference model is refused, not ignored: it would hold a model
    nobody asks. ``advantages`` takes its inputs from the other services, so it needs them.
    """
    from relax.distributed.resources import parse_ref_actor_config, parse_roles, service_roles

    roles = p.run(service_roles, args.resource)
    if roles is None:
        return
    if args.ref_update_interval is not None and "reference" in roles:
        p.add("not supported yet: --ref-update-interval with a 'reference' role in --resource (the service's "
              "copy is not updated)")
    if args.ref_actor_config is not None and not roles & {"reference", "actor_fwd"}:
        p.add("--ref-actor-config needs a reference or actor_fwd role in --resource")
    if not roles:
        return
    config = p.run(parse_ref_actor_config, args.ref_actor_config)
    if config is not None:
        args.ref_actor_config = config
    named = ", ".join(sorted(roles))
    if not args.fully_async:
        p.add(f"--resource roles {named} need --fully-async (the services feed the fully-async trainer)")
    if args.train_backend == "megatron":  # each runs the Megatron model on a GPU of its own (no CPU megatron-core)
        raw = parse_roles(args.resource)
        for role in sorted(roles - {"advantages"}):
            if not raw[role].gpus:
                p.add(f"--resource role {role!r} with --train-backend megatron needs 1 GPU a replica, got "
                      f"{raw[role].gpus} (its copy of the Megatron model runs on a GPU: megatron-core does not run "
                      "on CPU)")
    needs_ref = needs_reference_model(args)
    if "reference" in roles and not needs_ref:
        p.add("--resource role 'reference' needs a reference model (--use-kl-loss, --kl-loss-coef or "
              "--kl-coef); without one nothing uses it")
    if "advantages" in roles:
        _advantages_service(args, p, roles, needs_ref)


def _advantages_service(args: Namespace, p: Problems, roles: Set[str], needs_ref: bool) -> None:
    if args.advantage_estimator == "ppo":
        p.add("not supported yet: --resource role 'advantages' with --advantage-estimator ppo "
              "(the critic's values live in the trainer)")
    if args.use_opd and args.opd_type == "megatron":
        p.add("not supported yet: --resource role 'advantages' with --opd-type megatron "
              "(the teacher's log-probs live in the trainer)")
    if "actor_fwd" not in roles:
        p.add("--resource role 'advantages' needs 'actor_fwd' (it takes the old log-probs from it)")
    if needs_ref and "reference" not in roles:
        p.add("--resource role 'advantages' needs 'reference' with a KL term (it takes the reference "
              "log-probs from it)")


@rule
def _placement(args: Namespace, p: Problems) -> None:
    """``--resource`` with ``--num-gpus-per-node`` / ``--rollout-num-gpus-per-engine`` must make a plan
    (relax/distributed/resources.py); ``--device auto`` is checked as a CPU run here and planned again
    on the resolved device at start."""
    from relax.distributed.config import PlacementConfig
    from relax.distributed.resources import plan_resources

    p.run(lambda: plan_resources(PlacementConfig.from_args(args), "cuda" if args.device == "cuda" else "cpu"))


@rule
def _offload(args: Namespace, p: Problems) -> None:
    """Seed 000: ``--colocate`` sets both offloads; otherwise an unset one equals ``--offload``.

    ``--fully-async`` has nothing that can be offloaded (rollout and training run at the same time, so
    neither side is ever idle) and refuses an explicit request. With ``--train-backend megatron``,
    ``--colocate`` keeps the trainer on the GPU (every Megatron figure in docs/ was measured so); an explicit
    ``--offload-train`` (or ``--offload``) moves its gradient buffers and optimizer state
    (relax/backends/megatron/offload.py), except with ``--optimizer-cpu-offload``, whose optimizer state
    lives on the CPU already.
    """
    requested = {dest: getattr(args, dest) is True for dest in ("offload", "offload_train", "offload_rollout")}
    if args.fully_async:
        for dest, on in requested.items():
            if on:
                p.add(f"{_flag(dest)} has no effect with --fully-async (rollout and training overlap)")
        args.offload_train = args.offload_rollout = False
        return
    megatron = args.train_backend == "megatron"
    asked = requested["offload"] or requested["offload_train"]
    if megatron and asked and args.optimizer_cpu_offload:
        p.add("not supported yet: --offload-train with --optimizer-cpu-offload (its optimizer state is on the CPU "
              "already; drop one of them)")
    if args.colocate:
        args.offload_train = asked or not megatron
        args.offload_rollout = True
    if args.offload_train is None:
        args.offload_train = args.offload
    if args.offload_rollout is None:
        args.offload_rollout = args.offload


@rule
def _implied(args: Namespace, p: Problems) -> None:
    """Flags that switch other flags on (seed: 'Automatically enables / sets ...')."""
    if args.load_debug_rollout_data:
        args.debug_train_only = True
    p.run(debug_modes.check_offload, args)  # before --colocate turns the offloads on
    _offload(args, p)
    if args.debug_train_only or args.debug_rollout_only:  # one side is missing: nothing to offload for it
        args.offload_train = args.offload_rollout = False
    if args.use_rollout_routing_replay:
        args.use_routing_replay = True
    if args.train_backend == "megatron":
        args.bf16 = True  # the Megatron backend always trains bf16 weights with fp32 master weights


@rule
def _checkpoints(args: Namespace, p: Problems) -> None:
    """The checkpoint slice's own checks (`CheckpointConfig.validate`), and ``--ref-load``: the ``--hf-checkpoint``
    directory (how seed 004 passes the model, verl's ``model.path`` mapping to both: the reference model is then
    the initial policy, which it is anyway), a ``relax train --save`` directory whose checkpoint of
    ``--ref-ckpt-step`` (else its latest) the reference copy loads, or another HF model (directory or preset)."""
    from pathlib import Path

    from relax import checkpoint as ckpt
    from relax.backends.config import same_model
    from relax.models.registry import PRESETS
    from relax.utils import file_checks

    p.run(ckpt.CheckpointConfig.from_args, args)  # --rotate-ckpt, --async-save, --critic-*, --start-rollout-id
    if args.ref_load is None:
        if args.ref_ckpt_step is not None:
            p.add("--ref-ckpt-step requires --ref-load (a relax train --save directory)")
        return
    if ckpt.is_checkpoint_root(args.ref_load):
        step = args.ref_ckpt_step
        directory = p.run(lambda: ckpt.find_step(args.ref_load, step, flag="--ref-ckpt-step") if step is not None
                          else ckpt.find_latest(args.ref_load, flag="--ref-load", driver_state=False),
                          catch=(ckpt.CheckpointError,))
        if directory is not None:
            for problem in ckpt.backend_problems(directory, args.train_backend, "--ref-load"):
                p.add(problem)
        return
    if args.ref_ckpt_step is not None:
        p.add(f"--ref-ckpt-step {args.ref_ckpt_step}: --ref-load {args.ref_load} is not a relax train --save "
              f"directory (no {ckpt.LATEST_FILE})")
    if same_model(args.ref_load, args.hf_checkpoint):
        return
    if Path(args.ref_load).is_dir():  # another HF model (its vocabulary is checked when it loads)
        for problem in file_checks.hf_dir_problems(Path(args.ref_load), needs_model=True):
            p.add(f"--ref-load {args.ref_load}: {problem}")
    elif args.ref_load not in PRESETS:
        p.add(f"--ref-load {args.ref_load}: no such directory (an HF model directory, a relax train --save "
              "directory or a model preset)")


@rule
def _weight_files(args: Namespace, p: Problems) -> None:
    """``--hf-checkpoint DIR`` and ``--load``: their files present and complete; ``--save`` / ``--save-hf``: writable.
    All before Ray starts (relax/utils/file_checks.py: headers, sizes and the file system's flags only)."""
    from pathlib import Path

    from relax.utils import file_checks

    if args.hf_checkpoint and Path(args.hf_checkpoint).is_dir():
        for problem in file_checks.hf_dir_problems(Path(args.hf_checkpoint)):
            p.add(f"--hf-checkpoint {args.hf_checkpoint}: {problem}")
    if args.load:
        for problem in file_checks.checkpoint_problems(Path(args.load)):
            p.add(f"--load {args.load}: {problem}")
    for dest in ("save", "save_hf"):  # found at the first save otherwise, after a step has trained
        path = getattr(args, dest)
        problem = file_checks.writable_dir_problem(Path(path)) if path else None
        if problem:
            p.add(f"{_flag(dest)} {path}: cannot write there ({problem})")


@rule
def _weights_backup(args: Namespace, p: Problems) -> None:
    """``--disable-weights-backuper``: no host copy of the last sync (relax/weights/push.py Snapshot), which
    restarted engines (--use-fault-tolerance) and engines joining through --fleet-control-addr or the autoscaler
    (--autoscaler-config) are given."""
    if not args.disable_weights_backuper:
        return
    for dest, what in (("use_fault_tolerance", "a restarted engine"), ("fleet_control_addr", "a joining engine"),
                       ("autoscaler_config", "an engine the autoscaler adds")):
        if getattr(args, dest):
            p.add(f"--disable-weights-backuper with {_flag(dest)}: {what} is given the last sync's weights from "
                  "the trainer's host copy, which the flag turns off")


@rule
def _model_name(args: Namespace, p: Problems) -> None:
    """``--model-name``: a conversion family (relax/backends/megatron/config.py `model_family`), not contradicting the
    --hf-checkpoint config's own model_type."""
    if args.model_name is None:
        return
    from relax.backends.megatron.config import UnsupportedModelError, model_family
    from relax.models import resolve_checkpoint

    try:
        model_type = getattr(resolve_checkpoint(args.hf_checkpoint).config, "model_type", None)
    except (ValueError, TypeError):  # an unknown --hf-checkpoint fails with its own message
        model_type = None
    try:
        model_family(model_type, args.model_name)
    except UnsupportedModelError as exc:
        p.add(str(exc))


@rule
def _multimodal(args: Namespace, p: Problems) -> None:
    """The multimodal flags' values (relax/data/mm_config.py), and what a vision-language model runs on."""
    from relax.data.mm_config import multimodal_problems
    from relax.data.prefetch import prefetch_problems
    from relax.models import resolve_checkpoint
    from relax.models.omni import is_audio_config
    from relax.models.vision import is_vision_config

    for problem in [*multimodal_problems(args), *prefetch_problems(args.prefetch_chunk_size, args.prefetch_max_cached,
                                                                   args.prefetch_num_workers)]:
        p.add(problem)
    try:
        config = resolve_checkpoint(args.hf_checkpoint).config if args.hf_checkpoint else None
    except (ValueError, TypeError, OSError):  # an unknown --hf-checkpoint fails with its own message
        config = None
    vision = config is not None and is_vision_config(config)
    if args.multimodal_keys and args.hf_checkpoint and not vision:
        p.add(f"--multimodal-keys needs a vision-language --hf-checkpoint; {args.hf_checkpoint} has no vision tower "
              "(e.g. --hf-checkpoint tiny-qwen2.5-vl)")
    wants_audio = [f for f, on in (("--multimodal-keys audio", "audio" in (args.multimodal_keys or {})),
                                   ("--use-audio-in-video", args.use_audio_in_video)) if on]
    if wants_audio and args.hf_checkpoint and not (config is not None and is_audio_config(config)):
        p.add(f"{' and '.join(wants_audio)} need{'s' if len(wants_audio) == 1 else ''} an --hf-checkpoint with an audio tower; {args.hf_checkpoint} has none "
              "(e.g. --hf-checkpoint tiny-qwen2.5-omni)")
    if args.multimodal_keys and args.use_opd and args.opd_type == "sglang":
        p.add("not supported yet: --opd-type sglang with --multimodal-keys (the teacher's prompt-logprob requests "
              "carry no media)")
    if not vision:
        return
    if args.rollout_backend == "sglang":
        from relax.backends.sglang.vision import sglang_vision_problems

        for problem in sglang_vision_problems(args.multimodal_keys, config, args.hf_checkpoint):
            p.add(problem)
    if args.train_backend == "megatron":
        p.add(f"not supported yet: --train-backend megatron with a vision-language model ({args.hf_checkpoint}); "
              "train it with --train-backend torch")
    if args.rollout_backend == "embedded" and args.embedded_runner not in (None, "auto", "hf"):
        p.add(f"not supported yet: --embedded-runner {args.embedded_runner} with a vision-language model "
              "(the hf runner runs the vision tower)")


@rule
def _balance_data(args: Namespace, p: Problems) -> None:
    if not args.balance_data:
        return
    if args.fully_async:
        p.add("--balance-data is not available with --fully-async (seed 000: colocate mode only)")
    if args.train_backend != "torch":
        p.add(f"not supported yet: --balance-data with --train-backend {args.train_backend}")


@rule
def _prompt_data(args: Namespace, p: Problems) -> None:
    """``--prompt-data`` is one path or a list of them (seed 004: ``"['a.parquet', 'b.parquet']"``)."""
    from relax.data.dataset import prompt_files

    if args.prompt_data:
        p.run(prompt_files, args.prompt_data, catch=(ValueError,))


@rule
def _inputs(args: Namespace, p: Problems) -> None:
    """What every run needs: data (unless it trains on saved rollouts) and a length."""
    if not args.prompt_data and not args.debug_train_only:
        p.add("--prompt-data is required")
    if args.num_rollout is None and args.num_epoch is None and not args.debug_train_only:  # replays count files
        p.add("set --num-rollout or --num-epoch")


def _when_none(args: Namespace) -> None:
    """'When None, equals --x' defaults from the seed's tables (and a dict-returning grader's reward key)."""
    from relax.engine.rewards.graders import GRADER_REWARD_KEYS

    if args.reward_key is None and not args.custom_rm_path and args.rm_type in GRADER_REWARD_KEYS:
        args.reward_key = GRADER_REWARD_KEYS[args.rm_type]
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


@rule
def _elastic_fleet(args: Namespace, p: Problems) -> None:
    """The elastic fleet's slices (`ElasticConfig.validate`: a control endpoint off loopback needs its API key;
    `AutoscalerFlags.validate`: --autoscaler-config's file fits its schema)."""
    from relax.core.elastic import ElasticConfig

    p.run(ElasticConfig.from_args, args)
    if args.autoscaler_config is not None:  # --autoscaler-config: the file parses and fits its schema
        from relax.core.autoscaler import AutoscalerFlags

        p.run(AutoscalerFlags.from_args, args)


# The rules in the order they run; each reports into the collector and never raises.
RULES = (_inputs, _prompt_data, _checkpoints, _weight_files, _requirements, _train_loop, _true_on_policy,
         _routing_replay, _megatron_memory, _partial_rollout, _router, _transfer_queue, _rollout_engines, _weight_sync,
         _services, _weights_backup, _model_name, _balance_data, _placement, _elastic_fleet, _multimodal)


def resolve_and_validate(args: Namespace, explicit: Set[str] = frozenset(), p: Problems | None = None) -> None:
    """Fill derived defaults and check cross-flag rules. ``explicit``: dests given on the command line.

    Problems go into ``p`` when given (the caller raises them with its own); otherwise every problem
    found is raised at the end as one `ConfigError` (one line per problem).
    """
    own = p is None
    p = Problems() if own else p
    p.run(_implied, args, p)
    p.run(_batch_sizes, args, p, explicit)
    p.run(_qkv_format, args, p, explicit)
    for rule in RULES:
        p.run(rule, args, p)
    p.run(debug_modes.check, args)
    _when_none(args)
    if own:
        p.raise_if_any()
