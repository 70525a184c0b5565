"""Cross-flag rules and derived defaults, applied once after parsing (seed 000 semantics)."""

from __future__ import annotations

from argparse import Namespace

from relax.utils.arguments import ConfigError


def _batch_sizes(args: Namespace) -> None:
    if args.rollout_batch_size is None:
        if args.debug_train_only:
            return
        raise ConfigError("--rollout-batch-size is required")
    for name in ("rollout_batch_size", "n_samples_per_prompt", "micro_batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    total = args.rollout_batch_size * args.n_samples_per_prompt
    if args.num_steps_per_rollout is not None:
        if args.num_steps_per_rollout < 1 or total % args.num_steps_per_rollout:
            raise ConfigError(
                f"--num-steps-per-rollout {args.num_steps_per_rollout} must divide "
                f"rollout-batch-size x n-samples-per-prompt = {total}"
            )
        args.global_batch_size = total // args.num_steps_per_rollout
    if args.global_batch_size is None:
        args.global_batch_size = total
    if args.global_batch_size < 1 or total % args.global_batch_size:
        raise ConfigError(
            f"--global-batch-size {args.global_batch_size} must divide rollout-batch-size x n-samples-per-prompt "
            f"= {args.rollout_batch_size} x {args.n_samples_per_prompt} = {total}"
        )
    if not args.use_dynamic_batch_size and args.global_batch_size % args.micro_batch_size:
        raise ConfigError(
            f"--micro-batch-size {args.micro_batch_size} must divide --global-batch-size {args.global_batch_size}"
        )


def _exclusive(args: Namespace) -> None:
    if args.kl_coef and args.kl_loss_coef:
        raise ConfigError("--kl-coef and --kl-loss-coef cannot both be non-zero (reward shaping vs loss)")
    if args.only_train_params_name_list and args.freeze_params_name_list:
        raise ConfigError("--only-train-params-name-list and --freeze-params-name-list cannot be used together")
    if args.loss_type == "custom_loss" and not args.custom_loss_function_path:
        raise ConfigError("--loss-type custom_loss requires --custom-loss-function-path")
    if args.use_opd and not args.opd_type:
        raise ConfigError("--use-opd requires --opd-type (sglang or megatron)")
    if args.opd_type == "megatron" and not args.opd_teacher_load:
        raise ConfigError("--opd-type megatron requires --opd-teacher-load")
    if args.rm_type == "remote_rm" and not args.rm_url:
        raise ConfigError("--rm-type remote_rm requires --rm-url")
    if args.use_dynamic_batch_size and not args.max_tokens_per_gpu:
        raise ConfigError("--use-dynamic-batch-size requires --max-tokens-per-gpu")
    if args.save_interval is not None and args.save_interval < 1:
        raise ConfigError(f"--save-interval must be >= 1, got {args.save_interval}")


def _derived(args: Namespace) -> None:
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.critic_lr is None:
        args.critic_lr = args.lr
    if args.eval_input_key is None:
        args.eval_input_key = args.input_key
    if args.eval_max_context_len is None:
        args.eval_max_context_len = args.rollout_max_context_len
    if args.eval_reward_key is None:
        args.eval_reward_key = args.reward_key
    if args.log_probs_max_tokens_per_gpu is None:
        args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu
    if args.colocate or args.offload:
        args.offload_train = True
        args.offload_rollout = True
    if args.load_debug_rollout_data:
        args.debug_train_only = True
    if args.use_rollout_routing_replay:
        args.use_routing_replay = True
    if args.rollout_max_response_len is None:
        args.rollout_max_response_len = 128  # SGLang's own default for max_new_tokens


def resolve_and_validate(args: Namespace) -> None:
    if not args.prompt_data and not args.debug_train_only:
        raise ConfigError("--prompt-data is required")
    if args.num_rollout is None and args.num_epoch is None and not (args.debug_rollout_only or args.debug_train_only):
        raise ConfigError("set --num-rollout or --num-epoch")
    if args.num_rollout is not None and args.num_rollout < 1:
        raise ConfigError(f"--num-rollout must be >= 1, got {args.num_rollout}")
    _batch_sizes(args)
    _exclusive(args)
    _derived(args)
