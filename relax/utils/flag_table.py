"""The flag surface of ``relax train``: one declarative table, grouped like seed 000's tables.

Each flag's type, default, choices, help and support status live here and nowhere else;
docs/flags.md is generated from this table (``python -m relax.utils.flag_docs``).
Flags marked ``supported=False`` parse with their documented type and default, and fail with
``not supported yet: --flag`` when given any other value: nothing is accepted and ignored.
Defaults documented as ``-`` in the seed are Megatron-native flags; we use Megatron-LM's own
defaults for them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from relax.utils.flag_types import FLAG_TYPES, GiB, MiB

__all__ = ["FLAGS", "FLAGS_BY_NAME", "MODEL_GROUP", "FlagSpec", "GiB", "MiB", "SUPPORTED", "SUPPORTED_VALUES"]
MEGATRON_DEFAULT = "; default is Megatron-LM's own"


@dataclass(frozen=True)
class FlagSpec:
    name: str  # without the leading dashes
    type: str  # int | float | str | flag | bool | json | str_list | int_list | size
    default: Any
    group: str
    help: str
    choices: tuple[str, ...] | None = None
    required: bool = False
    seed_default: str | None = None  # the seed's wording when it is not the literal default ("-")
    supported: bool = False
    supported_values: frozenset[Any] | None = None  # for choice flags: the values implemented so far
    not_yet_why: str | None = None  # an unsupported flag's refusal names what rules it out (NOT_YET_WHY)
    bound: Bound | None = None  # the values that make sense (checked at parse time, shown in docs/flags.md)

    def __post_init__(self) -> None:
        if self.type not in FLAG_TYPES:
            raise ValueError(f"--{self.name}: unknown flag type {self.type!r}")

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class Bound:
    """A value range (``lo`` / ``hi`` inclusive unless ``*_open``), or ``nonempty`` for a string."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    nonempty: bool = False

    def __str__(self) -> str:
        if self.nonempty:
            return "non-empty"
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"{'<' if self.hi_open else '<='} {self.hi:g}")
        return " and ".join(parts)

    def admits(self, value: Any) -> bool:
        if self.nonempty:
            return bool(str(value).strip())
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)


POSITIVE, NON_NEGATIVE, AT_LEAST_1 = Bound(0, lo_open=True), Bound(0), Bound(1)
PROBABILITY_OPEN = Bound(0, 1, lo_open=True)  # (0, 1]
BETA = Bound(0, 1, hi_open=True)  # [0, 1)
NONEMPTY = Bound(nonempty=True)


def F(name: str, type_: str, default: Any, group: str, help_: str, **kw: Any) -> FlagSpec:  # noqa: N802
    return FlagSpec(name, type_, default, group, help_, **kw)


SEED_FLAGS: list[FlagSpec] = [
    # --- Ray Launch Parameters
    F('rollout-num-gpus-per-engine', 'int', 1, 'Ray Launch Parameters', "GPUs per SGLang inference engine, equivalent to SGLang's tp_size. Here: the engines are the rollout role's GPUs / this (each engine's GPUs on one node, --num-gpus-per-node at most); --rollout-backend sglang passes it as --tp-size; the embedded engine has one tensor-parallel rank (only 1); with --colocate engine i computes on GPUs i*N.. of the trainer ranks' GPUs (N must divide --num-gpus-per-node), its weights by CUDA IPC from rank 0's GPU, each rank's shards checked against SGLang's own hashes"),
    F('num-gpus-per-node', 'int', 8, 'Ray Launch Parameters', 'GPUs per node. Set this if using fewer than 8 GPUs per node in colocate mode. Here: each role\'s GPUs are reserved in groups of at most this many, each group on one node (a STRICT_PACK placement group; relax/distributed/resources.py), so a role spans ceil(GPUs / this) nodes; a group no node can hold fails at start, naming the nodes\' GPU counts'),
    F('resource', 'json', None, 'Ray Launch Parameters', 'Ray resource configuration in JSON format. Example: \'{"actor":[replicas, gpus], "rollout":[replicas, gpus]}\'. Here: a role\'s GPUs are replicas x gpus (seed 001\'s [1, 8] = 8 GPUs); the actor role runs one trainer rank per GPU (replicas ranks when gpus is 0, on CPU), one process group (NCCL on GPU, gloo on CPU; relax/distributed/trainer_group.py): data-parallel for torch, the TP x PP x EP x DP grid for megatron (docs/megatron.md); the rollout role runs GPUs / --rollout-num-gpus-per-engine engines (replicas when gpus is 0). GPUs are reserved as placement groups before any actor starts (relax/distributed/placement.py); --colocate puts trainer rank i and engine i on the same GPU, otherwise every role has GPUs of its own. A role left out gets [1, 1] on CUDA runs, [1, 0] on CPU runs. GPU counts are reserved on --device cpu runs too (a cluster that declares GPUs), and a request the cluster cannot hold fails at start in one line', seed_default='-'),
    F('colocate', 'flag', False, 'Ray Launch Parameters', 'Whether to colocate inference engines and training Actors on the same GPUs. Automatically sets --offload to True'),
    F('offload', 'flag', False, 'Ray Launch Parameters', 'Equivalent to setting both --offload-train and --offload-rollout. Refused with --fully-async (rollout and training overlap: nothing is idle to offload)'),
    F('offload-train', 'flag', None, 'Ray Launch Parameters', 'Whether to offload training Actor to CPU during training. Always True when --colocate is enabled; otherwise None resolves to --offload. Moves parameters, gradients and optimizer state to CPU during rollout and back before training (torch backend). With --train-backend megatron, --colocate leaves it False (the trainer stays on the GPU) and an explicit --offload-train or --offload frees the DDP gradient buffers and moves the optimizer\'s fp32 master weights and Adam moments to the CPU through megatron-core\'s own hooks; the bf16 weights stay on the GPU, where the weight sync after the offload reads them (relax/backends/megatron/offload.py); not with --optimizer-cpu-offload. With --fully-async --colocate leaves it False and an explicit request is refused'),
    F('offload-rollout', 'flag', None, 'Ray Launch Parameters', 'Whether to offload Rollout generator to CPU during training. Always True when --colocate is enabled; otherwise None resolves to --offload. Engines release KV cache and weights (/release_memory_occupation) after each rollout and resume before the next weight sync. With --fully-async --colocate leaves it False and an explicit request is refused'),
    F('distributed-backend', 'str', 'nccl', 'Ray Launch Parameters', 'Distributed backend. Here: the trainer ranks\' process group (relax/distributed/trainer_group.py): nccl (the default) is NCCL on CUDA runs and gloo on CPU runs, where NCCL cannot run; gloo is gloo on every run (not with --train-backend megatron on GPUs yet)'),
    F('distributed-timeout-minutes', 'int', 10, 'Ray Launch Parameters', 'Distributed timeout in minutes. Here: how long a trainer rank waits in the trainer group\'s rendezvous or a collective (a dead or stuck peer) before it fails'),
    # --- TransferQueue Data Queue
    F('num-data-storage-units', 'int', 1, 'TransferQueue Data Queue', "Number of TransferQueue SimpleStorageUnit actors. Here: Ray actors (0 CPUs) that hold each step's train samples, whole groups dealt round-robin, from rollout until the step is trained; the trainer actor fetches them directly (relax/core/transfer_queue.py). --fully-async only; must be >= 1"),
    F('max-staleness', 'int', 0, 'TransferQueue Data Queue', 'Maximum staleness for TransferQueue data system (0=on-policy). Here: with --fully-async, rollout for step s starts only once the engines hold version >= s - k, so rollout/start_version >= s - k and rollout/staleness_max <= k (with --partial-rollout a recycled sample keeps the version of its last segment while it waits in the buffer, so its staleness can exceed k; rollout/token_staleness_max counts from its oldest tokens); the colocate loop always trains on the current version (staleness 0), which satisfies any k, so seed 004\'s colocate scripts (--max-staleness 1) run unchanged; must be >= 0'),
    F('polling-mode', 'bool', True, 'TransferQueue Data Queue', "Whether to use polling mode when fetching metadata. Here: true, the trainer loop checks every 20 ms whether the next step's data is stored; false, it blocks until the rollout producer publishes it. --fully-async only"),
    F('num-iters-per-train-update', 'int', 1, 'TransferQueue Data Queue', 'Number of iterations per global batch in fully async pipeline. Here: the trainer runs its optimizer steps over each rollout batch this many times (PPO epochs; old/ref log-probs and advantages stay the ones computed before the first iteration); Relax uses it with --fully-async (seed 004: 4-8), the colocate loop honours it too. train/num_optimizer_steps logs the count; must be >= 1'),
    # --- Training Backend and Mode
    F('train-backend', 'str', 'megatron', 'Training Backend and Mode', 'Training backend selection (torch: plain PyTorch on CPU or GPU, a Relax harness addition). Here: megatron needs a CUDA GPU and megatron-core; on a machine without a GPU the default (when no flag, preset or config file names a backend) trains with torch and says so in a notice, while an explicit megatron is refused (relax/utils/machine_flags.py)', choices=('megatron', 'torch')),
    F('qkv-format', 'str', 'thd', 'Training Backend and Mode', 'QKV layout for Megatron backend. Dynamic batching not supported in bshd mode; must specify --micro-batch-size. Here: relax builds right-padded bshd micro-batches (dynamic batching included: each micro-batch is padded to its own longest sample); the default resolves to bshd, and an explicit thd (packed sequences) is refused: megatron-core runs packed_seq_params only in Transformer Engine\'s attention', choices=('thd', 'bshd',)),
    F('megatron-to-hf-mode', 'str', 'raw', 'Training Backend and Mode', 'Megatron to HF weight conversion method. bridge uses megatron bridge for automatic conversion', choices=('raw', 'bridge',)),
    F('true-on-policy-mode', 'flag', False, 'Training Backend and Mode', 'Whether to enable true on-policy mode. Here: the embedded engines report each finished sample\'s log-probs as the torch trainer computes them (one more forward of the sample, unpadded, the trainer\'s own code), and the trainer forwards one sample at a time, so rollout and trainer log-probs are bitwise equal (step-0 ppo_kl and the train/rollout mismatch exactly 0). Needs --train-backend torch, --rollout-backend embedded and --micro-batch-size 1; tokens are still drawn by the engine\'s fast path (relax/backends/embedded/train_identical.py)'),
    F('fully-async', 'flag', False, 'Training Backend and Mode', 'Whether to use fully asynchronous training pipeline'),
    # --- Checkpoint Configuration
    F('hf-checkpoint', 'str', None, 'Checkpoint Configuration', 'HuggingFace model checkpoint path. Used to initialize SGLang and provide tokenizer. Need not contain latest parameters, only consistent with training model architecture'),
    F('ref-load', 'str', None, 'Checkpoint Configuration', 'Reference model checkpoint path. Used as initial checkpoint for training when --load is not set. Here: the --hf-checkpoint directory itself (seed 004 passes the model to both; the reference is then the initial policy), a relax train --save directory (its --ref-ckpt-step checkpoint, else its latest; the torch backend reads its model.safetensors, Megatron its sharded mcore/ under this run\'s layout; a checkpoint of the other backend is refused in one line), or another HF model (directory or preset). Without --load the policy starts from its weights (which must fit --hf-checkpoint\'s shape; the first sync gives them to the engines) and the reference is that initial policy; with --load the policy resumes and the reference holds --ref-load\'s weights (an HF model of any shape with the policy\'s vocabulary), in the trainer or in the reference service'),
    F('ref-ckpt-step', 'int', None, 'Checkpoint Configuration', 'Reference model checkpoint step. Here: which iter_<N> checkpoint of a relax train --save --ref-load directory the reference model loads (its latest when unset); a step not saved there is refused in one line naming the saved steps, as is an --ref-load that is not such a directory'),
    F('load', 'str', None, 'Checkpoint Configuration', 'Actor model checkpoint load path. Specify for resuming training'),
    F('save', 'str', None, 'Checkpoint Configuration', 'Path to save model during training'),
    F('save-interval', 'int', None, 'Checkpoint Configuration', 'Model save interval in steps'),
    F('save-hf', 'str', None, 'Checkpoint Configuration', 'Path to save HuggingFace format model for Megatron backend. Path can include {rollout_id} placeholder'),
    F('async-save', 'flag', False, 'Checkpoint Configuration', 'Asynchronous checkpoint saving. Here: the torch trainer copies its state (model, optimizer, critic, RNG) to host memory, then writes it in a background thread while the next steps train; the driver publishes the checkpoint once written, waits for a save in flight before the next save and after the last step, and a failed write ends the run in one line naming the file (relax/checkpoint_io.py, relax/core/saver.py). The files are the same as without it. With --train-backend megatron: megatron-core\'s own async sharded save (dist_checkpointing.save with async_sharded_save, its mcore strategy): every rank copies its shards to host memory, a forked process writes them, and the finalization (every rank agrees the writes are done, then metadata.json) runs at the next step\'s start or when the driver waits (relax/backends/megatron/async_save.py)'),
    F('no-save-optim', 'flag', False, 'Checkpoint Configuration', 'Do not save optimizer state in checkpoint. Reduces checkpoint size but prevents resuming training from that checkpoint'),
    F('rotate-ckpt', 'flag', False, 'Checkpoint Configuration', 'Whether to rotate checkpoints. Requires setting --save, --save-interval, and --async-save. Here: every step is saved (in the background), so a resume loses at most one step; after each save only the newest checkpoint and the --save-interval ones (steps s with (s + 1) % interval == 0) stay, the newest --max-actor-ckpt-to-keep of the latter when set (all when unset). Missing --save, --save-interval or --async-save is refused in one line'),
    F('max-actor-ckpt-to-keep', 'int', None, 'Checkpoint Configuration', 'Maximum number of Actor checkpoints to keep. Here: after each published save, the iter_* directories under --save beyond the newest N are removed (and under a separate --critic-save the same steps); the newest, which latest_checkpointed_iteration.txt names, always stays. With --rotate-ckpt: how many --save-interval checkpoints stay besides the newest; must be >= 1'),
    F('checkpoint-engine-backend', 'str', 'nccl', 'Checkpoint Configuration', 'Checkpoint engine backend. Here: slime\'s checkpoint engine is its path for pushing the trainer\'s weights into the inference engines, and this flag its collective\'s backend; in Relax that is the distributed weight-sync transport (--weight-sync-transport, relax/weights/transports/distributed.py), whose broadcast group is NCCL when the trainer\'s weights are on a GPU and gloo where NCCL cannot run (host weights: CPU runs, an offloaded trainer). nccl, the default, is that; gloo makes the group gloo for GPU weights too (each bucket is copied to the trainer\'s host memory and broadcast from there: where NCCL cannot connect the trainer and the engines); the weights reach SGLang servers and relax\'s engine alike (each receives over gloo into its GPU). Other values (p2p / RDMA) are refused'),
    F('critic-load', 'str', None, 'Checkpoint Configuration', 'Critic model checkpoint path. When None, equals --load. Here: the PPO critic (--advantage-estimator ppo) is loaded from this directory\'s checkpoint of the step --load resumes (else its latest); requires --load'),
    F('critic-save', 'str', None, 'Checkpoint Configuration', 'Critic model save path. Here: when None, equals --save (critic.safetensors and critic_optimizer.pt beside the actor\'s files); otherwise the critic\'s files go to <critic-save>/iter_<step>/ with its own latest marker, saved and pruned with the actor\'s. --advantage-estimator ppo only; requires --save'),
    # --- Dataset
    F('prompt-data', 'str', None, 'Dataset', 'Training prompt dataset path'),
    F('input-key', 'str', 'input', 'Dataset', 'Key for input field in dataset'),
    F('label-key', 'str', None, 'Dataset', 'Key for label field in dataset'),
    F('metadata-key', 'str', 'metadata', 'Dataset', 'Key for metadata field in dataset'),
    F('tool-key', 'str', 'tools', 'Dataset', 'Key for tools field when applying Chat Template'),
    F('apply-chat-template', 'flag', False, 'Dataset', 'Apply Chat Template to input as OpenAI message format'),
    F('apply-chat-template-kwargs', 'json', {}, 'Dataset', 'Additional parameters for Chat Template'),
    F('system-prompt', 'str', None, 'Dataset', 'Optional system prompt added before user input. Final message is <system_prompt> + <dataset_prompt>'),
    F('rollout-shuffle', 'flag', False, 'Dataset', 'Whether to shuffle prompt order during Rollout'),
    F('rollout-seed', 'int', 42, 'Dataset', 'Random seed for Rollout, used for shuffling prompts and random sampling'),
    F('use-streaming-dataset', 'flag', False, 'Dataset', 'Use streaming dataset to save memory. Here: the --prompt-data files are read as prompts are drawn (jsonl line by line, parquet by record batches of one row group), never held whole; each record becomes a sample as the in-memory loader makes it (template, --custom-prompt-path, the --rollout-max-prompt-len filter); with --rollout-shuffle, through a shuffle buffer of --streaming-buffer-size records seeded by --rollout-seed + epoch (without it, file order: the in-memory order). A checkpoint holds the file position, the buffered records and the generator state, so --load resumes at the exact next prompt (relax/data/streaming.py). --num-epoch counts records, too-long ones included'),
    F('streaming-buffer-size', 'int', 10000, 'Dataset', 'Buffer size for streaming dataset. Here: the records the shuffle buffer holds; each draw takes a random one and refills its slot from the files, and the buffer drains at an epoch\'s end, so each epoch serves every record once; must be >= 1'),
    F('prefetch-chunk-size', 'int', 32, 'Dataset', 'Number of samples to dispatch to the thread-pool in each prefetch round. Larger values increase throughput but also memory pressure. Only effective when --use-streaming-dataset is set and the dataset contains multimodal data. Here: the records the background thread draws per round (relax/data/prefetch.py), at most the cache\'s free room'),
    F('prefetch-max-cached', 'int', 256, 'Dataset', 'Maximum number of pre-loaded samples kept in the prefetch cache. When the cache is full the background prefetch thread pauses until consumers free space. Set to 0 to disable prefetching. Only effective when --use-streaming-dataset is set and the dataset contains multimodal data. Here: with --multimodal-keys and --use-streaming-dataset, drawn records wait here with their images decoding; the samples and their order are those without the cache, and a resume restarts at the rollout\'s position, not the thread\'s'),
    F('prefetch-num-workers', 'int', 1, 'Dataset', 'Number of parallel worker threads inside the prefetch buffer for I/O-bound media decoding (video/image). Set to 1 to serialise all decoding (safest for FFmpeg which is not fully thread-safe). Higher values increase parallelism but may trigger EAGAIN errors on some platforms. Only effective when prefetching is enabled. Here: the threads that load, resize and patch the prefetched records\' images (with --mm-processor-pool-size > 0 they hand the work to that process pool)'),
    F('custom-prompt-path', 'str', None, 'Dataset', 'Dotted import path to a custom function that transforms the prompt before conversation/multimodal processing. Function signature: def custom_fn(prompt, data: dict) -> prompt. Example: my_package.prompt_utils.add_prefix. Here: called per record, before the chat template and the length filter, by both loaders (in-memory: at start; --use-streaming-dataset: as records are drawn); a bad path fails at start, and a hook that raises stops the run in one line naming the hook and the record\'s file:line'),
    F('data-source-path', 'str', 'relax.engine.rollout.data_source.RolloutDataSourceWithBuffer', 'Dataset', 'Rollout data source class path. Here: built once by the driver as cls(args) (the default class also gets the tokenizer); the run calls get_samples(num_groups) -> list[list[Sample]], add_samples(groups) (recycled groups), state_dict() / load_state_dict(state) (checkpoints) and, when --num-rollout is unset, num_rollout_for_epochs(num_epoch, rollout_batch_size); an object lacking any of them is refused at launch in one line naming them'),
    F('start-rollout-id', 'int', None, 'Dataset', 'Starting Rollout step. If not set, attempts to read from checkpoint specified by --load. Here: the run trains steps N .. --num-rollout - 1 (the engines start at weight version N); with --load the weights, optimizer and data position come from its latest checkpoint while the step is N; must be >= 0 and below --num-rollout'),
    # --- Multimodal Data
    F('multimodal-keys', 'json', None, 'Multimodal Data', 'Multimodal data field mapping. Example: \'{"image": "image_key"}\'. Here: image, video and audio keys; an image column holds one image or a list (local path, relative to the prompt file or absolute; data: URI or base64; bytes; a parquet {bytes, path} struct; a URL is refused, runs are offline), a video column a list of videos, each a list of frame images or {"frames": [...], "fps": F} (with --use-audio-in-video also "audio": <clip>; a video file is refused in one line: no av/decord here), an audio column one clip or a list (a WAV path, data: URI or base64, WAV bytes, a parquet {bytes, path} struct, or {"array": [...], "sampling_rate": R}; other containers and URLs are refused in one line); each <image> / <video> / <audio> in the prompt becomes its tokens, the engine gets them as SGLang\'s image_data / video_data / audio_data (a video as its sampled frames, a clip as a 16-bit WAV data URI at --audio-sample-rate); needs a vision-language --hf-checkpoint (e.g. tiny-qwen2.5-vl), and for audio one with an audio tower (tiny-qwen2.5-omni, a Qwen2.5-Omni thinker)'),
    F('use-audio-in-video', 'flag', False, 'Multimodal Data', 'Whether to process audio in video. Here: each video must then carry its sound track ({"frames": [...], "fps": F, "audio": <clip>}, refused in one line without it); the track goes in as audio, its tokens interleaved with the video\'s by 2-second chunks inside the video\'s <|vision_start|><|audio_bos|> ... <|audio_eos|><|vision_end|> (Qwen2.5-Omni\'s layout, relax/data/multimodal.py), and the engine gets it in audio_data with SGLang\'s use_audio_in_video; without the flag a track is ignored. Needs an audio-capable --hf-checkpoint (tiny-qwen2.5-omni)'),
    F('image-max-token-num', 'int', None, 'Multimodal Data', 'Maximum token count for image processing. Default is 16384 if not set. Here: a larger image is scaled down (aspect kept) to at most this many image tokens of --image-resize-scale-factor pixels square (relax/data/image_budget.py)'),
    F('image-min-token-num', 'int', None, 'Multimodal Data', 'Minimum token count for image processing. Default is 4 if not set. Here: a smaller image is scaled up to at least this many image tokens'),
    F('video-min-token-num', 'int', None, 'Multimodal Data', 'Minimum token count for video frame processing. Default is 128 if not set. Here: per frame: a smaller frame is scaled up to at least this many tokens (--image-resize-scale-factor pixels square)'),
    F('video-max-token-num', 'int', None, 'Multimodal Data', 'Maximum token count for video frame processing. Default is 768 if not set. Here: per frame: a larger frame is scaled down to at most this many tokens'),
    F('video-fps', 'float', None, 'Multimodal Data', 'Target FPS for video processing. Default is 2.0 if not set. Here: a clip keeps duration x this many frames, spread evenly (relax/data/video_frames.py); a bare frame list is taken to be at this rate'),
    F('video-fps-min-frames', 'int', None, 'Multimodal Data', 'Minimum frames for video processing. Default is 4 if not set. Here: the fewest frames kept (rounded up to --frame-factor); a shorter clip repeats its last frame'),
    F('video-fps-max-frames', 'int', None, 'Multimodal Data', 'Maximum frames for video processing. Default is 768 if not set. Here: the most frames kept (and never more than the clip has)'),
    F('image-resize-scale-factor', 'int', None, 'Multimodal Data', 'Scale factor for image resize dimension alignment. Default uses patch_size * spatial_merge_size (typically 28). Set to 0 to disable alignment. Here: the pixels per image-token side for the budget and the multiple each side is rounded to (tiny-qwen2.5-vl: 8 * 2 = 16); with 0 the scaled size is kept and the image processor aligns it to its patches'),
    F('audio-sample-rate', 'int', None, 'Multimodal Data', 'Sample rate for audio processing. Default is 16000 if not set. Here: every clip is resampled to it (band-limited sinc, relax/data/audio.py) and its log-mel features are computed at it (Whisper\'s 400-sample window every 160 samples, so rate / 160 frames a second and about a quarter as many audio tokens); the engine resamples audio_data to it too. Qwen2.5-Omni checkpoints are trained at 16000; must be >= 1000'),
    F('frame-factor', 'int', None, 'Multimodal Data', 'Frame alignment factor. Default is 2 if not set. Here: the kept frame count is a multiple of it (a multiple of the model\'s temporal patch size, 2, or the run fails at start)'),
    F('mm-processor-pool-size', 'int', 0, 'Multimodal Data', 'Size of the multimodal processor pool. 0 (default) disables the pool and uses ThreadPoolExecutor. When set to a positive integer, creates a ProcessPoolExecutor with the specified number of workers for true parallelism without GIL contention. Here: the pool loads, resizes and patches each record\'s images (all records at start, or each as a streaming dataset draws it)'),
    # --- Sampling Parameters
    F('num-rollout', 'int', None, 'Sampling Parameters', 'Total number of Rollout rounds. Choose either this or --num-epoch'),
    F('num-epoch', 'int', None, 'Sampling Parameters', 'Number of training epochs. Automatically calculates num_rollout based on dataset size. Ignored if --num-rollout is also set'),
    F('rollout-batch-size', 'int', None, 'Sampling Parameters', 'Number of prompts per rollout round. Total data = rollout-batch-size * n-samples-per-prompt. Required (a --preset or --config may provide it)', required=True),
    F('n-samples-per-prompt', 'int', 1, 'Sampling Parameters', 'Number of responses generated per prompt'),
    F('rollout-temperature', 'float', 1.0, 'Sampling Parameters', 'Sampling temperature for inference engine'),
    F('rollout-top-p', 'float', 1.0, 'Sampling Parameters', 'Top-p sampling parameter for inference engine'),
    F('rollout-top-k', 'int', -1, 'Sampling Parameters', 'Top-k sampling parameter for inference engine. -1 means not used'),
    F('rollout-max-response-len', 'int', None, 'Sampling Parameters', "Maximum response length, equivalent to SGLang's max_tokens. When None, 128 (SGLang's default max_new_tokens)"),
    F('rollout-max-prompt-len', 'int', None, 'Sampling Parameters', 'Maximum prompt length. Filters long prompts during dataset initialization if set'),
    F('rollout-max-context-len', 'int', None, 'Sampling Parameters', 'Maximum context length for inference engine. Should not exceed max_position_embeddings in HuggingFace model config.json'),
    F('rollout-stop', 'str_list', None, 'Sampling Parameters', 'Stop words for Rollout. Can be one or multiple strings'),
    F('rollout-stop-token-ids', 'int_list', None, 'Sampling Parameters', 'Stop token IDs for Rollout'),
    F('rollout-skip-special-tokens', 'flag', False, 'Sampling Parameters', 'Whether to skip special tokens in responses'),
    # --- Oversampling and Dynamic Filtering
    F('over-sampling-batch-size', 'int', None, 'Oversampling and Dynamic Filtering', 'Sampling batch granularity. When None, uses rollout-batch-size. Must be >= rollout-batch-size'),
    F('dynamic-sampling-filter-path', 'str', None, 'Oversampling and Dynamic Filtering', 'Dynamic sampling filter function path. Implements filters like DAPO (e.g., excluding all-correct or all-wrong samples). Example: relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std'),
    F('buffer-filter-path', 'str', None, 'Oversampling and Dynamic Filtering', 'Buffer filter function path. Function signature: list[list[Sample]] -> list[list[Sample]]'),
    # --- Partial Rollout
    F('partial-rollout', 'flag', False, 'Partial Rollout', 'Enable partial Rollout. Incomplete samples are recycled to data buffer, suitable for long response scenarios. Here: a step ends once --rollout-batch-size groups are done; running requests are aborted through /abort_request and their groups recycled with their tokens, log-probs and per-token weight versions, resumed by a later step (relax/engine/rollout/partial_rollout.py). With --fully-async each step\'s rollout is one such partial rollout, run ahead by up to --max-staleness versions; weight syncs land between two rollouts, so every segment of a sample comes from one version'),
    F('partial-rollout-max-aborted-count', 'int', None, 'Partial Rollout', 'Maximum number of times a sample can be aborted. After reaching threshold, sample is guaranteed to complete'),
    F('mask-offpolicy-in-partial-rollout', 'flag', False, 'Partial Rollout', 'Whether to mask previous generation in partial Rollout. When set, only on-policy generated tokens participate in training'),
    # --- Weight Update
    F('update-weight-buffer-size', 'size', 512 * MiB, 'Weight Update', 'Buffer size for weight updates in bytes. Updates weights in chunks, useful for MoE models'),
    F('update-weights-interval', 'int', 1, 'Weight Update', 'Weight update interval. Here: the engines get the trainer\'s weights after every N-th rollout step (after steps N-1, 2N-1, ...; the initial push at start always happens), so the steps in between generate with the last synced version: samples.jsonl records each trained sample\'s weight_version and staleness, metrics.jsonl rollout/staleness_max; --check-weight-update-equal checks every sync that happens (weights.jsonl). With --fully-async the rollout waits for the version its schedule gives step - --max-staleness. With --offload-rollout (--colocate) only the steps that end with a sync release the engines\' memory (released weights are lost, only a sync writes them back); must be >= 1'),
    F('keep-old-actor', 'flag', False, 'Weight Update', 'Whether to keep Rollout model during training. Here: the torch trainer keeps a frozen copy of the weights the engines hold (the initial or resumed weights, then the trainer\'s weights after every step that ends with a sync) and computes the old log-probs (the PPO ratio\'s denominator, and --use-rollout-entropy) with it, so with --update-weights-interval N > 1 the steps between syncs use the policy that generated their data rather than the trainer\'s current weights; one more model copy on the trainer\'s device (moved by --offload-train; with --train-backend megatron one more GPTModel in the policy\'s parallel layout); train/old_actor_refreshed logs the steps that refresh it. Not with --fully-async or routing replay yet (relax/backends/torch/old_actor.py)'),
    # --- External Inference Engine
    F('rollout-external', 'flag', False, 'External Inference Engine', 'Use external SGLang instance instead of framework-launched instance. Here: the run starts no engines and drives the servers at --rollout-external-engine-addrs (SGLang, or relax serve-engine) over SGLang\'s HTTP API: generation through the run\'s router, weights by /init_weights_update_group + /update_weights_from_distributed (the trainer hosts the group: the servers must reach this host); an unreachable address fails the start with one line naming it. With --use-fault-tolerance a server that dies is dropped and the run goes on with the others (they cannot be restarted)'),
    F('rollout-external-engine-addrs', 'str_list', None, 'External Inference Engine', 'List of external engine addresses and ports. Here: HOST:PORT or http://HOST:PORT, one per server; needs --rollout-external'),
    # --- SGLang Engine Parameters
    F('sglang-mem-fraction-static', 'float', None, 'SGLang Engine Parameters', 'SGLang static memory allocation ratio. Here: --rollout-backend sglang passes it as --mem-fraction-static; every other SGLang option X of ServerArgs is accepted as --sglang-X (checked against SGLang\'s option list pinned in relax/backends/sglang/server_args.json; options the launcher sets from Relax\'s flags are refused, naming the flag to use)', seed_default='-'),
    F('sglang-profile', 'flag', False, 'SGLang Engine Parameters', 'Enable torch profiling on SGLang engines during rollout. Profile traces will be saved per rollout step. Here: the driver POSTs /start_profile to every engine before each selected rollout and /stop_profile after it (relax/observability/sglang_profile.py); the embedded engine serves both with torch.profiler over its forward steps (relax/backends/embedded/profiling.py); traces per step under <dir>/step<N>/'),
    F('sglang-profile-steps', 'int_list', None, 'SGLang Engine Parameters', 'List of absolute rollout step IDs (0-indexed) at which to enable SGLang profiling. Takes precedence over --sglang-profile-step-start/end. Example: --sglang-profile-steps 3 10 50. Here: with none of the three step flags set, every rollout step is profiled'),
    F('sglang-profile-step-start', 'int', None, 'SGLang Engine Parameters', 'Start of the rollout step range for SGLang profiling (inclusive, 0-indexed). Used with --sglang-profile-step-end to specify a contiguous range. Ignored if --sglang-profile-steps is set. Here: unset with --sglang-profile-step-end set: from step 0'),
    F('sglang-profile-step-end', 'int', None, 'SGLang Engine Parameters', 'End of the rollout step range for SGLang profiling (inclusive, 0-indexed). Used with --sglang-profile-step-start to specify a contiguous range. Ignored if --sglang-profile-steps is set. E.g. start=2, end=4 profiles steps 2, 3, 4. Here: unset with --sglang-profile-step-start set: to the last step'),
    F('sglang-profile-output-dir', 'str', None, 'SGLang Engine Parameters', 'Output directory for SGLang profile traces. Defaults to traces/<tb_experiment_name>/sglang_trace. Here: the default is <output-dir>/traces/<tb-experiment-name, else the output dir\'s name>/sglang_trace; each step\'s traces in its step<N>/ (sent to the engines as an absolute output_dir)'),
    F('sglang-profile-num-steps', 'int', 3, 'SGLang Engine Parameters', 'Number of SGLang forward steps to profile per rollout. -1 profiles the entire rollout step until stop_profile is called. Here: sent as num_steps (-1: none, so the session ends at the /stop_profile after the rollout); an engine that already stopped on its own answers the stop with \'not in progress\', which is not an error'),
    F('sglang-profile-activities', 'str_list', ['CPU', 'GPU'], 'SGLang Engine Parameters', 'Activities to profile (e.g., CPU GPU). Here: sent as activities; the embedded engine records CPU, GPU (CUDA activity when it runs on a GPU) and MEM (profile_memory), and refuses RPD in one line'),
    F('sglang-profile-by-stage', 'flag', False, 'SGLang Engine Parameters', 'Profile by stage (prefill/decode) separately. Here: sent as profile_by_stage; the embedded engine refuses it (one trace per session), so the run fails at the first profiled step in one line'),
    F('sglang-profile-with-stack', 'flag', False, 'SGLang Engine Parameters', 'Record call stack in profile traces. Here: sent as with_stack (false when not given)'),
    F('sglang-profile-record-shapes', 'flag', False, 'SGLang Engine Parameters', 'Record tensor shapes in profile traces. Here: sent as record_shapes'),
    # --- Custom Rollout Functions
    F('rollout-function-path', 'str', 'relax.engine.rollout.sglang_rollout.generate_rollout', 'Custom Rollout Functions', 'Rollout generation function path. Here: generate_rollout(args, rollout_id, data_source, evaluation=False) -> list[list[Sample]], called by the driver once per step in place of the built-in rollout, each group one prompt\'s samples (with --eval-interval and no --eval-function-path it is also the evaluation, called with evaluation=True and answering as --eval-function-path says); a path that cannot be imported or takes fewer than 3 arguments is refused at launch'),
    F('custom-generate-function-path', 'str', None, 'Custom Rollout Functions', 'Custom generate function to replace default rollout generate function. Suitable for multi-turn dialogue, function calling, etc.'),
    F('rollout-data-postprocess-path', 'str', None, 'Custom Rollout Functions', 'Rollout data postprocessing function, called after all data (including log_probs) is fetched. Can be used to update loss mask'),
    F('custom-rollout-log-function-path', 'str', None, 'Custom Rollout Functions', 'Custom Rollout logging function. Here: log_rollout_data(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool (slime\'s signature), called after each step\'s rollout with the trained samples and the step\'s rollout/* metrics; keys it adds to that dict are logged with the step; True leaves the default rollout/* metrics out (relax/core/rollout_log_hook.py); loaded at launch'),
    F('custom-eval-rollout-log-function-path', 'str', None, 'Custom Rollout Functions', 'Custom evaluation Rollout logging function. Here: log_eval_rollout_data(rollout_id, args, data, extra_metrics) -> bool (slime\'s signature), called by the driver after each eval with data = {eval set name: {samples, rewards}} and the eval/* metrics; keys it adds to that dict are logged with the step; True leaves the default eval/* metrics out (relax/core/eval_log_hook.py); loaded at launch'),
    # --- Batch Configuration
    F('global-batch-size', 'int', None, 'Batch Configuration', 'Global batch size. Defines sample count needed for one parameter update (optimizer.step). When None, rollout-batch-size * n-samples-per-prompt (one update per rollout)'),
    F('micro-batch-size', 'int', 1, 'Batch Configuration', 'Micro batch size. Ignored when --use-dynamic-batch-size is enabled'),
    F('num-steps-per-rollout', 'int', None, 'Batch Configuration', 'Training steps per Rollout. Equivalent to setting GBS = rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout'),
    F('use-dynamic-batch-size', 'flag', False, 'Batch Configuration', "Enable dynamic batching. Dynamically packs samples by length so each micro-batch's total tokens approach --max-tokens-per-gpu limit"),
    F('max-tokens-per-gpu', 'int', None, 'Batch Configuration', 'Maximum tokens per GPU. Must be set when dynamic batching is enabled. Should be set to approximately max_response_len / cp_size when using CP. Here: tokens = micro-batch rows x their longest sequence. Without --use-dynamic-batch-size (seed 004\'s template passes it with --micro-batch-size 1) the train forward takes --micro-batch-size samples and this budget packs the no-grad old/reference/teacher log-prob passes only (they keep no activations, so they fit more samples per pass); step-0 ppo_kl is then 0 up to float rounding instead of bitwise'),
    F('log-probs-max-tokens-per-gpu', 'int', None, 'Batch Configuration', 'Maximum tokens per GPU when computing log probs. When None, equals max-tokens-per-gpu. Here: with or without --use-dynamic-batch-size'),
    F('balance-data', 'flag', False, 'Batch Configuration', 'Use karmarkar_karp algorithm to balance token count across data parallel ranks. Only available in colocate mode; not supported with --fully-async. Note: different responses for the same prompt may be assigned to different training steps. Here: --train-backend torch; each optimizer step\'s micro-batches are dealt to the data-parallel ranks by Karmarkar-Karp on their padded token counts instead of round robin (same gradient, the sum is order-free); samples never move between steps. One rank: nothing to balance'),
    # --- Parallelism Configuration
    F('tensor-model-parallel-size', 'int', 1, 'Parallelism Configuration', 'Tensor parallelism size. Here: --train-backend megatron; must divide the trainer\'s ranks (one per --resource actor GPU) together with the pipeline size, and the model\'s attention heads, key/value heads and FFN size; the vocabulary is padded to a multiple of it (docs/megatron.md)'),
    F('pipeline-model-parallel-size', 'int', 1, 'Parallelism Configuration', 'Pipeline parallelism size. Here: --train-backend megatron; layers split evenly over the stages (it must divide the layer count), micro-batches run through megatron-core\'s 1F1B schedule'),
    F('sequence-parallel', 'flag', False, 'Parallelism Configuration', 'Enable sequence parallelism. Here: --train-backend megatron with --tensor-model-parallel-size > 1 (refused otherwise); needed with expert and tensor parallelism together (megatron-core\'s rule)'),
    F('context-parallel-size', 'int', 1, 'Parallelism Configuration', 'Context parallelism size. Here: only 1: megatron-core runs context parallelism only in Transformer Engine\'s attention (TEDotProductAttention), not installed on our machines; larger sizes are refused'),
    F('expert-model-parallel-size', 'int', 1, 'Parallelism Configuration', 'Expert parallelism size (for MoE models). Here: --train-backend megatron with a Qwen3-MoE or Mixtral model; must divide the expert count'),
    F('expert-tensor-parallel-size', 'int', 1, 'Parallelism Configuration', 'Expert tensor parallelism size. Here: --train-backend megatron with a MoE model; must divide the expert FFN size'),
    # --- Recomputation
    F('recompute-granularity', 'str', None, 'Recomputation', 'Recomputation granularity: full, selective (native Megatron parameter' + MEGATRON_DEFAULT + ': off). Here: --train-backend megatron only (refused with torch), the trainer\'s model only. full checkpoints whole transformer layers (megatron\'s tensor_parallel.checkpoint) and needs --recompute-method and --recompute-num-layers; selective checkpoints core attention in every layer (megatron\'s default recompute_modules core_attn) and takes neither. Same loss and gradients, less activation memory, one more forward of the checkpointed part in backward. Neither needs Transformer Engine. Selective saves little with the default sdpa (flash) core attention, which keeps no s x s scores; it matters for the unfused attention', choices=('full', 'selective'), seed_default='-'),
    F('recompute-method', 'str', None, 'Recomputation', 'Recomputation method: uniform, block (native Megatron parameter' + MEGATRON_DEFAULT + ': unset). Here: with --recompute-granularity full only (required there, refused otherwise). uniform: checkpoint the layers in chunks of --recompute-num-layers; block: checkpoint the first --recompute-num-layers layers, keep the rest\'s activations', choices=('uniform', 'block'), seed_default='-'),
    F('recompute-num-layers', 'int', None, 'Recomputation', 'Number of layers to recompute (native Megatron parameter' + MEGATRON_DEFAULT + ': unset). Here: with --recompute-granularity full only (required there, refused otherwise); between 1 and the model\'s layer count (checked when the backend builds the model)', seed_default='-'),
    # --- Optimizer Configuration
    F('lr', 'float', 1e-06, 'Optimizer Configuration', 'Learning rate'),
    F('optimizer', 'str', 'adam', 'Optimizer Configuration', 'Optimizer type (native Megatron parameter' + MEGATRON_DEFAULT + '). Here: adam is AdamW (--adam-beta1/2, eps 1e-8); sgd is SGD with --sgd-momentum (0.9, Megatron-LM\'s default) and L2 --weight-decay. The torch backend\'s policy and every critic build it in relax/backends/optimizer.py; --train-backend megatron passes it to megatron-core\'s OptimizerConfig (sgd not with --use-distributed-optimizer: megatron-core\'s distributed optimizer holds Adam state only). A checkpoint\'s optimizer state loads only under the --optimizer that saved it', choices=('adam', 'sgd'), seed_default='-'),
    F('lr-decay-style', 'str', 'constant', 'Optimizer Configuration', 'Learning rate decay style (native Megatron parameter' + MEGATRON_DEFAULT + '). Here: megatron-core\'s scheduler shapes without warm-up, from --lr to 0 over every optimizer step of the run (so a style other than constant needs --num-rollout), for both backends (relax/backends/lr_schedule.py): linear, cosine, inverse-square-root (--lr / sqrt(step), step counted from 1), WSD (--lr until the last --lr-wsd-decay-iters steps, then --lr-wsd-decay-style down to 0); train/lr logs each step\'s rate.', choices=('constant', 'linear', 'cosine', 'inverse-square-root', 'WSD'), seed_default='-'),
    F('weight-decay', 'float', 0.01, 'Optimizer Configuration', 'Weight decay (native Megatron parameter' + MEGATRON_DEFAULT + ')', seed_default='-'),
    F('adam-beta1', 'float', 0.9, 'Optimizer Configuration', 'Adam beta1 (native Megatron parameter' + MEGATRON_DEFAULT + ')', seed_default='-'),
    F('adam-beta2', 'float', 0.999, 'Optimizer Configuration', 'Adam beta2 (native Megatron parameter' + MEGATRON_DEFAULT + ')', seed_default='-'),
    F('clip-grad', 'float', 1.0, 'Optimizer Configuration', 'Gradient clipping'),
    F('seed', 'int', 1234, 'Optimizer Configuration', 'Random seed'),
    F('optimizer-cpu-offload', 'flag', False, 'Optimizer Configuration', 'Enable CPU offload for optimizer state (native Megatron parameter' + MEGATRON_DEFAULT + '). Here: --train-backend megatron only; megatron\'s HybridDeviceOptimizer with optimizer_offload_fraction 1.0: fp32 master weights, Adam moments and the Adam update (torch AdamW, fused CPU kernel) all on the CPU; grads go to pinned host memory and updated bf16 weights back each step. Needs --use-precision-aware-optimizer and so --use-distributed-optimizer (Megatron-LM\'s rules); saving its optimizer state is not supported yet (--save needs --no-save-optim)', seed_default='-'),
    F('overlap-cpu-optimizer-d2h-h2d', 'flag', False, 'Optimizer Configuration', 'Overlap CPU optimizer D2H/H2D communication (native Megatron parameter' + MEGATRON_DEFAULT + '). Here: with --optimizer-cpu-offload only (refused without it): the grad and weight copies run on side CUDA streams, one CPU optimizer per parameter, so copies overlap the CPU update; same results', seed_default='-'),
    F('use-precision-aware-optimizer', 'flag', False, 'Optimizer Configuration', 'Use precision-aware optimizer (native Megatron parameter' + MEGATRON_DEFAULT + '). Here: --train-backend megatron only, needs --use-distributed-optimizer; the optimizer, not megatron, holds the fp32 master weights (fp32 moments: no precision change). With --optimizer-cpu-offload they live on the CPU; without it megatron-core needs Transformer Engine\'s FusedAdam, refused when transformer_engine is not installed', seed_default='-'),
    F('use-distributed-optimizer', 'flag', False, 'Optimizer Configuration', 'Shard optimizer state, ZeRO-1 style (native Megatron parameter' + MEGATRON_DEFAULT + '). Here: --train-backend megatron only; the optimizer state is sharded over the data-parallel ranks; --save writes each rank\'s shards into the megatron-core distributed checkpoint (dp_reshardable: a resume may use another data-parallel size, the same tensor / pipeline / expert sizes), and a resume must use the same setting', seed_default='-'),
    F('overlap-grad-reduce', 'flag', False, 'Optimizer Configuration', 'Overlap backward compute with grad reduce-scatter (native Megatron parameter' + MEGATRON_DEFAULT + '). Here: --train-backend megatron; megatron-core DDP\'s overlap_grad_reduce, wired as Megatron-LM does (the schedule\'s no_sync around every micro-batch but the last, start_grad_sync for the pipeline\'s stages): each gradient bucket is all-reduced (reduce-scattered with --use-distributed-optimizer) as soon as the last micro-batch\'s backward fills it, and the optimizer step waits for the rest; the same sums as without it (relax/backends/megatron/backend.py)', seed_default='-'),
    F('overlap-param-gather', 'flag', False, 'Optimizer Configuration', 'Overlap reduce-scatter with next-step param all-gather; requires --overlap-grad-reduce (native Megatron parameter' + MEGATRON_DEFAULT + '). Here: --train-backend megatron with --use-distributed-optimizer; the distributed optimizer leaves the all-gather of its updated shards to the next forward (megatron-core DDP\'s forward pre-hooks, bucket by bucket), so the optimizer steps of one rollout overlap it; after a rollout\'s last step the gather is finished at once, before the weight sync, a checkpoint or the reference / old-actor copies read the weights', seed_default='-'),
    F('calculate-per-token-loss', 'flag', False, 'Optimizer Configuration', 'Calculate loss per token (native Megatron parameter' + MEGATRON_DEFAULT + ')'),
    # --- Advantage Estimation
    F('advantage-estimator', 'str', 'grpo', 'Advantage Estimation', 'Advantage estimator. Note: OPD is now independent of advantage estimator; enable OPD on any estimator with --opd-kl-coef > 0. Here: ppo trains a critic, a plain torch value model (the policy\'s body and a scalar head, fp32, AdamW at --critic-lr; relax/backends/torch/critic.py): with --train-backend megatron every rank holds a full copy (not sharded by TP / PP), runs its data-parallel rank\'s micro-batches and reduces gradients over the data-parallel group, and rank 0 saves it beside the shards', choices=('grpo', 'gspo', 'on_policy_distillation', 'sapo', 'cispo', 'rloo', 'reinforce_plus_plus', 'reinforce_plus_plus_baseline', 'ppo')),
    F('normalize-advantages', 'flag', False, 'Advantage Estimation', 'Whether to normalize advantages'),
    F('disable-grpo-std-normalization', 'flag', False, 'Advantage Estimation', 'Disable GRPO standard deviation normalization (from Dr.GRPO)', seed_default='-'),
    F('disable-rewards-normalization', 'flag', False, 'Advantage Estimation', 'Disable reward normalization', seed_default='-'),
    F('disable-compute-advantages-and-returns', 'flag', False, 'Advantage Estimation', 'Disable advantage and return computation. Used for SFT or custom loss functions', seed_default='-'),
    # --- Loss Function
    F('loss-type', 'str', 'policy_loss', 'Loss Function', 'Loss type. When custom_loss, must set --custom-loss-function-path', choices=('policy_loss', 'custom_loss',)),
    F('custom-loss-function-path', 'str', None, 'Loss Function', 'Custom loss function path'),
    F('eps-clip', 'float', 0.2, 'Loss Function', 'PPO clipping range (lower bound)'),
    F('eps-clip-high', 'float', None, 'Loss Function', 'PPO clipping upper bound. When None, equals --eps-clip'),
    F('eps-clip-c', 'float', None, 'Loss Function', 'Dual-clip PPO value lower bound (paper)'),
    F('value-clip', 'float', 0.2, 'Loss Function', 'Value function clipping range'),
    F('entropy-coef', 'float', 0.0, 'Loss Function', 'Entropy loss coefficient'),
    # --- KL Divergence Related
    F('kl-coef', 'float', 0.0, 'KL Divergence Related', 'KL penalty coefficient for reward shaping (applied to reward signal before advantage calculation). Cannot be non-zero simultaneously with --kl-loss-coef'),
    F('use-kl-loss', 'flag', False, 'KL Divergence Related', 'Whether to use KL loss in GRPO'),
    F('kl-loss-coef', 'float', 0.0, 'KL Divergence Related', 'KL penalty coefficient added to final PPO loss. Cannot be non-zero simultaneously with --kl-coef'),
    F('kl-loss-type', 'str', 'k1', 'KL Divergence Related', 'KL estimator for the KL loss and KL reward shaping', choices=('k1', 'k2', 'k3', 'low_var_kl')),
    F('use-unbiased-kl', 'flag', False, 'KL Divergence Related', 'Enable unbiased KL estimation'),
    F('ref-update-interval', 'int', None, 'KL Divergence Related', 'Reference model update interval in Rollout steps. None means no update. Here: after every N-th rollout step\'s training the trainer copies the actor\'s weights into the reference model (either backend; Megatron: rank by rank, in the policy\'s parallel layout) (train/ref_updated 1 in that step\'s metrics), so the next step\'s KL to the reference starts at 0. Needs a reference model (--use-kl-loss, --kl-loss-coef or --kl-coef); not with a \'reference\' role in --resource yet; must be >= 1'),
    # --- SAPO Parameters
    F('sapo-tau-pos', 'float', 1.0, 'SAPO Parameters', 'SAPO positive advantage temperature'),
    F('sapo-tau-neg', 'float', 1.05, 'SAPO Parameters', 'SAPO negative advantage temperature'),
    # --- Critic Configuration
    F('num-critic-only-steps', 'int', 0, 'Critic Configuration', 'Number of steps to train Critic only'),
    F('critic-train-only', 'flag', False, 'Critic Configuration', 'Train Critic model only'),
    F('critic-lr', 'float', None, 'Critic Configuration', 'Critic learning rate. When None, equals --lr'),
    F('critic-lr-warmup-iters', 'int', 0, 'Critic Configuration', 'Number of iterations for linear warmup of Critic model'),
    # --- Off-Policy Correction
    F('use-rollout-logprobs', 'flag', False, 'Off-Policy Correction', "Use Rollout's logprobs when computing importance sampling ratio. When not set, uses Actor model's logprobs"),
    F('use-tis', 'flag', False, 'Off-Policy Correction', 'Enable TIS (Truncated Importance Sampling) off-policy importance sampling'),
    F('tis-clip', 'float', 2.0, 'Off-Policy Correction', 'Upper clipping threshold for importance sampling ratio'),
    F('tis-clip-low', 'float', 0.0, 'Off-Policy Correction', 'Lower clipping threshold for importance sampling ratio'),
    F('custom-tis-function-path', 'str', None, 'Off-Policy Correction', 'Custom TIS/RS function path'),
    F('custom-pg-loss-reducer-function-path', 'str', None, 'Off-Policy Correction', 'Custom pg_loss reducer function path. When set, pg_loss uses custom reducer while other metrics use default sum_of_sample_mean'),
    # --- Routing Replay and OPSM
    F('use-routing-replay', 'flag', False, 'Routing Replay and OPSM', 'Enable Routing Replay (paper). Here: a MoE policy (e.g. small-qwen3-moe) with --train-backend torch or megatron (megatron-core\'s RouterReplay in the policy\'s routers; with --recompute-granularity full the backward\'s recomputed forward replays too); the old-log-prob forward records each token\'s top-k experts per MoE layer and the update\'s forwards replay them, keeping the router\'s own softmax weights for the forced experts (docs/algorithms.md); train/routing_replay_tokens counts the forced tokens'),
    F('use-rollout-routing-replay', 'flag', False, 'Routing Replay and OPSM', 'Enable Rollout Routing Replay (paper). Automatically enables --use-routing-replay. Here (R3): requests ask the engines for return_routed_experts (SGLang\'s meta_info.routed_experts; a real SGLang server needs --sglang-enable-return-routed-experts), each sample keeps its routing, prompt included, and every policy forward (old log-probs and update) replays it'),
    F('use-opsm', 'flag', False, 'Routing Replay and OPSM', 'Enable Off-Policy Sequence Masking (OPSM)'),
    F('opsm-delta', 'float', 0.0001, 'Routing Replay and OPSM', 'OPSM threshold'),
    # --- Other Training Options
    F('reset-optimizer-states', 'flag', False, 'Other Training Options', 'Whether to reset optimizer state after each Rollout. Here: the trainer clears Adam\'s moments and step counts (the torch backend: the actor\'s and the critic\'s AdamW; Megatron: every torch optimizer inside megatron\'s optimizer, this rank\'s shards with --use-distributed-optimizer, and the critic\'s AdamW) before it trains each rollout batch, so every rollout starts Adam afresh (bias correction included); not with --optimizer-cpu-offload yet'),
    F('use-rollout-entropy', 'flag', False, 'Other Training Options', 'Whether to compute entropy when calculating logprobs. Used for special loss mask. Here: the old-policy log-prob pass (either backend) also computes each response token\'s entropy; the --rollout-data-postprocess-path hook gets it as rollout_data["entropy"] ([N, T], to build a loss mask from) and metrics.jsonl logs train/rollout_entropy (its mean over the loss mask). The entropy of the training forward (train/entropy, --entropy-coef) is computed either way'),
    F('get-mismatch-metrics', 'flag', False, 'Other Training Options', 'Whether to compute mismatch metrics. Requires setting --custom-tis-function-path'),
    # --- Parameter Freezing and Selective Training
    F('only-train-params-name-list', 'str_list', None, 'Parameter Freezing and Selective Training', 'List of regex patterns for parameters to train. Other parameters are frozen. Cannot be used simultaneously with --freeze-params-name-list. Example: --only-train-params-name-list experts'),
    F('freeze-params-name-list', 'str_list', None, 'Parameter Freezing and Selective Training', 'List of regex patterns for parameters to freeze. Other parameters remain trainable. Example: --freeze-params-name-list embedding output_layer'),
    # --- Evaluation Configuration
    F('eval-interval', 'int', None, 'Evaluation Configuration', 'Evaluation interval in Rollout rounds'),
    F('eval-prompt-data', 'str_list', None, 'Evaluation Configuration', 'Evaluation datasets in format: dataset_name /path/to/data.jsonl. Can specify multiple pairs'),
    F('eval-config', 'str', None, 'Evaluation Configuration', 'OmegaConf YAML/JSON evaluation config file path. When set, overrides --eval-prompt-data. Here: a typed schema (relax/engine/rollout/eval_file.py), {"eval": {"defaults": {...}, "datasets": [{"name", "path", ...}]}}; a dataset\'s or the defaults\' keys are input_key, label_key, tool_key, max_prompt_len, n_samples_per_eval_prompt, temperature, top_p, top_k, max_response_len and min_new_tokens, each falling back to the defaults, then to its --eval-* flag; each dataset is an eval set (eval/<name>/...). A missing file, a file that is not YAML (.json: JSON), an unknown key or a wrong type fails the launch, one line per problem naming the file and the key'),
    F('eval-function-path', 'str', None, 'Evaluation Configuration', 'Evaluation generation function path. When None, uses --rollout-function-path. Here: called by the driver at each --eval-interval step as fn(args, rollout_id, data_source, evaluation=True) in place of the built-in evaluation (which runs while the path is the built-in generate_rollout); it returns {set name: {"rewards": [float], "samples": [Sample]}} (logged as eval/<name>/reward_mean, handed to --custom-eval-rollout-log-function-path) and may add {name: number} metrics (logged as eval/<name>); relax/core/eval_function.py'),
    F('skip-eval-before-train', 'flag', False, 'Evaluation Configuration', 'Whether to skip evaluation before training'),
    F('eval-input-key', 'str', None, 'Evaluation Configuration', 'Key for input field in evaluation data. When None, uses --input-key'),
    F('eval-label-key', 'str', None, 'Evaluation Configuration', 'Key for label field in evaluation data'),
    F('eval-tool-key', 'str', None, 'Evaluation Configuration', 'Key for tool field in evaluation data'),
    F('n-samples-per-eval-prompt', 'int', 1, 'Evaluation Configuration', 'Number of samples per evaluation prompt'),
    F('eval-temperature', 'float', None, 'Evaluation Configuration', 'Sampling temperature for evaluation'),
    F('eval-top-p', 'float', None, 'Evaluation Configuration', 'Top-p parameter for evaluation'),
    F('eval-top-k', 'int', None, 'Evaluation Configuration', 'Top-k parameter for evaluation'),
    F('eval-max-response-len', 'int', None, 'Evaluation Configuration', 'Maximum response length for evaluation'),
    F('eval-max-prompt-len', 'int', None, 'Evaluation Configuration', 'Maximum prompt length for evaluation'),
    F('eval-min-new-tokens', 'int', None, 'Evaluation Configuration', 'Minimum new tokens generated for evaluation. Here: sent as SGLang\'s min_new_tokens in every eval request\'s sampling params (--rollout-backend sglang); the embedded engine does not implement it yet, so a non-zero value is refused there'),
    F('eval-max-context-len', 'int', None, 'Evaluation Configuration', 'Maximum context length for evaluation. When None, equals --rollout-max-context-len. Here: each eval request\'s max_new_tokens is cut to this minus its prompt length (0 when the prompt fills it; --custom-generate-function-path gets the uncut params)'),
    # --- Reward Configuration
    F('rm-type', 'str', None, 'Reward Configuration', 'Built-in reward model type'),
    F('custom-rm-path', 'str', None, 'Reward Configuration', 'Custom reward function path. Function signature: def custom_rm(args, sample) -> float'),
    F('reward-key', 'str', None, 'Reward Configuration', 'Key to extract reward value when reward function returns dict'),
    F('eval-reward-key', 'str', None, 'Reward Configuration', 'Reward key for evaluation. When None, equals --reward-key'),
    F('group-rm', 'flag', False, 'Reward Configuration', 'Whether to compute reward for entire group'),
    F('rm-url', 'str', None, 'Reward Configuration', 'Remote reward model service URL (for --rm-type remote_rm)'),
    F('custom-reward-post-process-path', 'str', None, 'Reward Configuration', 'Custom reward postprocessing function path. Default is GRPO normalization'),
    F('custom-convert-samples-to-train-data-path', 'str', None, 'Reward Configuration', 'Custom function to convert samples to training data. Signature: def convert_samples_to_train_data(args, samples) -> dict'),
    # --- GenRM (Generative Reward Model)
    F('genrm-model-path', 'str', None, 'GenRM (Generative Reward Model)', 'GenRM model path. Enables GenRM when set. Here: the run starts the judge\'s own embedded engines over this checkpoint (an HF directory or a preset name; relax/core/genrm_engines.py), never synced with the policy, and every sample\'s reward is parsed from the judgement it writes to --genrm-engine-config\'s prompt_template: by default the last number in the text, or a reward_parser hook; a judgement with no number gets unparsed_reward (0.0) and counts in rollout/genrm_unparsed_frac. Requests follow --rm-type remote_rm\'s rules (all of a step\'s samples at once, retries, --hook-timeout per sample); a judge engine that dies ends the run in one line naming it (genrm:<i>). Replaces --rm-type; refused with --custom-rm-path or --group-rm (relax/engine/rewards/genrm.py)'),
    F('genrm-num-gpus', 'int', 1, 'GenRM (Generative Reward Model)', 'Total GPUs for GenRM. Here: the number of judge engines (one GPU each), in their own placement group on one node beside --resource\'s GPUs; on CPU the number of CPU judge engines'),
    F('genrm-num-gpus-per-engine', 'int', 1, 'GenRM (Generative Reward Model)', 'GPUs per GenRM engine instance. Here: 1 only (an embedded judge engine runs on one GPU; larger values are refused in one line)'),
    F('genrm-engine-config', 'json', None, 'GenRM (Generative Reward Model)', 'GenRM engine initialization parameters. Example: \'{"dp_size": 1, "pp_size": 1, "max_total_tokens": 8192}\'. Here: max_total_tokens is the judge engine\'s context length; dp_size, when given, must equal the number of judge engines (--genrm-num-gpus / --genrm-num-gpus-per-engine); pp_size 1 only. Relax keys: prompt_template (a format string over {prompt}, {response}, {label}), reward_parser (a dotted path parse(judgement: str, sample) -> float | None; None: unparseable), unparsed_reward (0.0). Unknown keys are refused (relax/engine/rewards/genrm_config.py)'),
    F('genrm-sampling-config', 'json', None, 'GenRM (Generative Reward Model)', 'GenRM sampling parameters. Available keys: temperature (default 0.1), top_p (default 1.0), top_k (default -1), max_response_len (default 4096). Here: the sampling_params of every judge request (max_response_len as max_new_tokens); unknown keys are refused'),
    # --- On-Policy Distillation (OPD)
    F('use-opd', 'flag', False, 'On-Policy Distillation (OPD)', 'Enable On-Policy Distillation. Must also specify --opd-type'),
    F('opd-type', 'str', None, 'On-Policy Distillation (OPD)', 'OPD type. sglang: fetch teacher model logprobs from external SGLang server; megatron: load teacher model via --opd-teacher-load', choices=('sglang', 'megatron',)),
    F('opd-kl-coef', 'float', 1.0, 'On-Policy Distillation (OPD)', 'OPD KL penalty coefficient'),
    F('opd-teacher-load', 'str', None, 'On-Policy Distillation (OPD)', 'OPD teacher model checkpoint path. Required when --opd-type=megatron'),
    F('opd-teacher-ckpt-step', 'int', None, 'On-Policy Distillation (OPD)', 'OPD teacher model checkpoint step. Here: when --opd-teacher-load is a relax train --save directory (it holds latest_checkpointed_iteration.txt), the teacher is an --hf-checkpoint-shaped model with the weights of its iter_<N> checkpoint (its latest when unset); a step not saved there is refused in one line naming the saved steps, as is an --opd-teacher-load that is not such a directory or holds the other backend\'s checkpoint. --opd-type megatron (the teacher in the trainer), either backend'),
    # --- Fault Tolerance Configuration
    F('use-fault-tolerance', 'flag', False, 'Fault Tolerance Configuration', 'Whether to enable fault tolerance during Rollout'),
    F('use-health-check', 'flag', False, 'Fault Tolerance Configuration', "Whether to enable global health check system. Controller's HealthManager monitors all services and triggers automatic restart on failure"),
    F('max-global-restart', 'int', 3, 'Fault Tolerance Configuration', 'Maximum number of global restarts allowed. Training terminates after exceeding. Only effective when --use-health-check is enabled'),
    F('rollout-health-check-interval', 'float', 30.0, 'Fault Tolerance Configuration', 'Rollout engine health check interval in seconds'),
    F('rollout-health-check-timeout', 'float', 30.0, 'Fault Tolerance Configuration', 'Rollout engine health check timeout in seconds'),
    F('rollout-health-check-first-wait', 'float', 0.0, 'Fault Tolerance Configuration', 'Initial wait time before starting health check in seconds. Increase this value when using deepgemm'),
    # --- Autoscaler
    F('autoscaler-config', 'str', None, 'Autoscaler', 'Path to autoscaler YAML configuration file. Enables autoscaling when set, disabled when not set. Example: --autoscaler-config relax/utils/autoscaler/autoscaler.yaml. Here: the file is checked at start (one line per bad field; schema in relax/utils/autoscaler/config.py, documented default in relax/utils/autoscaler/autoscaler.yaml); every poll_interval_s the run reads its signals (colocate: rollout time share; fully-async: queue depth and staleness; any mode: the router\'s requests in flight per engine) and scales its own fleet out or in (relax/core/autoscaler.py, through the elastic fleet) within min_engines/max_engines and the cooldowns; each decision is an autoscale_decision event in events.jsonl with its reason and the signal values. A joining GPU engine shares a running engine\'s GPU (relax/core/elastic.py; on the H200 a joiner was up in 19 s, healthy 5 s later and joined with equal weights; one serving after its join is not yet measured on a GPU)'),
    # --- Scale-Out Operation Parameters
    F('scale-out-timeout', 'float', 300.0, 'Scale-Out Operation Parameters', 'Timeout for all scale-out operations (engine startup, connect, health check, weight sync) in seconds. Here: one deadline for a whole scale-out (relax/core/elastic.py): each new engine must start, answer /health_generate and take the current weights (the last sync\'s own bytes) within it, or it counts as failed and --scale-out-partial-success-policy decides'),
    F('scale-out-partial-success-policy', 'str', 'rollback_all', 'Scale-Out Operation Parameters', 'Policy for partial success during scale-out. rollback_all reverts all engines on any failure; keep_partial keeps successfully scaled engines. Here: the decision is a scale_out_decision event in events.jsonl; removed engines are killed and never served a request', choices=('rollback_all', 'keep_partial',)),
    # --- Scale-In Operation Parameters
    F('scale-in-drain-timeout', 'float', 30.0, 'Scale-In Operation Parameters', 'Timeout to wait for in-flight requests to drain before force-aborting (seconds). Here: the leaving engine gets no new request from the router; what it still runs after this long is aborted, and the rollout puts those samples back in the buffer (--partial-rollout keeps their tokens and resumes them; otherwise they are generated again), so none is lost'),
    F('scale-in-shutdown-timeout', 'float', 30.0, 'Scale-In Operation Parameters', 'Timeout for graceful SGLang engine shutdown; ray.kill is used if exceeded (seconds). Here: the same for the embedded engine\'s actor; an engine_left event says stopped or killed'),
    # --- TensorBoard
    F('use-tensorboard', 'flag', False, 'TensorBoard', 'Enable TensorBoard logging'),
    F('tb-project-name', 'str', None, 'TensorBoard', 'TensorBoard log directory. Defaults to environment variable TENSORBOARD_DIR'),
    F('tb-experiment-name', 'str', None, 'TensorBoard', 'TensorBoard experiment name'),
    # --- ClearML
    F('use-clearml', 'flag', False, 'ClearML', 'Enable ClearML logging. Here: one ClearML task per run, Task.init(project_name=--tb-project-name or relax, task_name=--tb-experiment-name or the output dir\'s name); the config is task.connect-ed and every numeric step metric reported with report_scalar(title, series, value, iteration=step), title/series split at the first / (relax/metrics/clearml_logger.py); CLEARML_OFFLINE_MODE=1 keeps it offline; needs the clearml extra (pip install \'relax-harness[clearml]\'), else refused at launch in one line'),
    # --- Metrics Service
    F('use-metrics-service', 'flag', False, 'Metrics Service', 'Enable centralized metrics collection and reporting service. Here: always on, the flag only confirms it: the driver collects every component\'s metrics (rollout, trainer, services, engines, evaluation) into metrics.jsonl and the --use-tensorboard writer, one record per step'),
    F('timeline-dump-dir', 'str', None, 'Metrics Service', "Timeline trace event export directory (Chrome Trace format). Timeline tracing disabled if not set. Here: DIR/timeline.json, written at the run's end whatever its status: one row per actor (driver, trainer ranks, engines, services, reward scoring) with spans for steps, phases, generate, reward, train, log-prob forwards, optimizer updates, sync, offload/onload and checkpoint, and fault markers (relax/observability/timeline.py)"),
    # --- Logging Options
    F('log-passrate', 'flag', False, 'Logging Options', 'Enable pass@n pass rate logging'),
    F('log-multi-turn', 'flag', False, 'Logging Options', 'Enable multi-turn Rollout information logging. Here: raw_response_length/response_length_{mean,max,min,clip_ratio} (observations included), wo_obs_response_length/response_length_{mean,max,min} (the loss mask) and multi_turn_metric/round_number_{mean,max,min} in metrics.jsonl (relax/observability/rollout_logs.py)'),
    F('log-correct-samples', 'flag', False, 'Logging Options', 'Log correct samples. Here: over the samples of each step whose reward is 1: rollout/correct_samples, rollout/correct_response_len_mean, rollout/correct_entropy and correct_length/p25..p100 (share of correct responses per quarter of --rollout-max-response-len) in metrics.jsonl'),
    F('log-reward-category', 'str', None, 'Logging Options', 'Log reward category statistics. Specify key in reward dict. Here: samples grouped by the value of KEY in their dict reward: reward_category/<value>/frac and reward_category/<value>/reward_mean in metrics.jsonl'),
    # --- Notifications
    F('notify-urls', 'str', None, 'Notifications', 'Apprise notification URL list (comma-separated). Here: a notice through apprise (Apprise().add(url), .notify(title, body)) when the run starts, and when it finishes or fails (an interrupted run counts as failed); a notice that cannot be sent is one console line, never a failure (relax/observability/notify.py); needs the notify extra (pip install \'relax-harness[notify]\'), else refused at launch in one line'),
    # --- Router Configuration
    F('use-slime-router', 'flag', False, 'Router Configuration', "Use SlimeRouter for text-based routing instead of SGLang's token-based routing. Here: the run's router (relax/engine/router/, least-loaded and sticky as always) takes text /generate bodies as SGLang does, and the default rollout and evaluation send each prompt as text (Sample.prompt) with return_prompt_token_ids instead of input_ids: the engine tokenizes it, and the sample's prompt tokens become the engine's prompt_token_ids, so training sees exactly the ids the engine ran (prompt + output_ids, log-probs per output id), shaped as without the flag (relax/engine/rollout/prompt_input.py). Custom generate functions (multi-turn included) still send whatever body they build, and the OPD teacher scores token ids. With --partial-rollout a sample goes as text until it has response tokens; a resumed one goes as its token ids (text cannot carry the response it already has)"),
    F('slime-router-middleware-paths', 'str_list', None, 'Router Configuration', 'List of middleware paths. Here: dotted paths of classes M(router, config) with async __call__(self, request: RoutedRequest, call_next) -> RoutedResponse (relax/engine/router/middleware.py), built once in the given order (the first outermost) around every request the router sends to one engine (/generate, other passed-through paths), not its broadcasts; a middleware may change the request (JSON body, routing key, engine headers), answer it itself, or change the answer. Needs --use-slime-router; a path that does not import or fit the hook fails the launch in one line naming it, and a middleware that raises answers 500 naming it'),
    F('slime-router-timeout', 'float', None, 'Router Configuration', 'SlimeRouter HTTP request timeout in seconds. Here: the run\'s router (relax/engine/router/) gives up on a request to an engine after this long, failing it in one line naming the engine (unset: 600 s, GENERATE_TIMEOUT_S in relax/engine/router/in_process.py; a hung engine that still answers /health is found only this way: docs/waits.md)'),
    F('slime-router-max-connections', 'int', None, 'Router Configuration', 'SlimeRouter HTTP client maximum connections. Here: the run\'s router\'s connection pool to the engines (None: 1024)'),
    F('slime-router-health-check-failure-threshold', 'int', 3, 'Router Configuration', 'Mark worker as unhealthy after this many consecutive failures. Here: the run\'s router checks every engine\'s /health each second and, after this many failures in a row, sends it requests only while no healthy engine is left (removing dead engines is --use-fault-tolerance\'s job)'),
    # --- Other Training Parameters
    F('train-env-vars', 'json', {}, 'Other Training Parameters', 'Additional environment variables for training process. Here: a JSON object of NAME: value (strings or numbers), set in the Ray runtime env of the training processes (every trainer rank and the fully-async services, on whatever node they land; the engines and the driver do not get them), over the worker defaults (one thread, offline); anything else is a one-line error'),
    F('train-memory-margin-bytes', 'size', GiB, 'Other Training Parameters', 'Reserved space for training memory allocation. Here: before each step\'s training a CUDA trainer rank (torch or megatron backend) checks that it can still allocate this much (the device\'s free memory plus its own allocator\'s unused cache) and otherwise stops the run in one line naming both sizes, rather than running out of memory inside the step; 0 turns the check off; CPU ranks have nothing to check. Sizes as 1073741824, 512MB, 1GB (relax/backends/torch/memory_margin.py)'),
    F('disable-weights-backuper', 'flag', False, 'Other Training Parameters', 'Disable weight backup to save host memory. Here: the one host-memory copy of the weights Relax keeps is the trainer\'s snapshot of the last sync\'s bytes (relax/weights/push.py; one model\'s size in host memory), kept only with --use-fault-tolerance (a restarted engine is resynced from it, never from the trainer\'s live weights) or --fleet-control-addr (a joining engine gets it); the flag keeps none, and so is refused with either in one line. Nothing else needs it: the reference model and --keep-old-actor live on the trainer\'s device, --offload-train moves the trainer\'s own tensors, and the engines keep no CPU backup of released weights (the next sync rewrites them)', seed_default='-'),
    F('custom-model-provider-path', 'str', None, 'Other Training Parameters', 'Custom model provider function path. Here: a dotted path to a function that builds the policy model in place of relax (relax/models/provider.py). --train-backend torch: provider(config) -> torch.nn.Module, an HF-style causal LM (forward(input_ids, attention_mask=..., position_ids=...) with .logits); config is the transformers config relax builds from --hf-checkpoint (a preset\'s or the directory\'s config.json, _attn_implementation set); it runs with --seed in force, a preset keeps its init, a directory\'s weights are loaded into it by name; the reference copy and fully-async services use it too; --save-hf needs a transformers PreTrainedModel (save_pretrained). --train-backend megatron: Megatron-LM\'s model_provider(pre_process=True, post_process=True, vp_stage=None, config=None) returning this pipeline stage\'s megatron-core GPTModel (vp_stage and config, relax\'s TransformerConfig, passed when it takes them). The engines build their model from --hf-checkpoint and load the weight sync by name, so the provider\'s model must keep the checkpoint\'s parameter names and shapes. Checked at launch: a path that does not import or a wrong signature, and with torch a wrong return type or other names or shapes (one build on the meta device), are one line naming the path; megatron\'s return type and names are checked when the trainer builds it'),
    F('recompute-loss-function', 'flag', False, 'Other Training Parameters', 'Whether to recompute loss function to save VRAM. Here: the trainer (either backend; Megatron: inside megatron-core\'s schedule, on the last pipeline stage) runs the logits -> log-probs / entropy -> policy loss part of each micro-batch under activation checkpointing (torch.utils.checkpoint): only the logits are kept, and that part (its [tokens, vocab] fp32 log-softmax and the loss\'s temporaries) runs again in the backward; the same loss and gradients'),
    F('log-probs-chunk-size', 'int', -1, 'Other Training Parameters', 'Chunk size for computing log probs. Used to save VRAM'),
    F('allgather-cp', 'flag', False, 'Other Training Parameters', 'Here (the seed describes it as -): an option of context parallelism, refused for the reason --context-parallel-size > 1 is'),
    F('model-name', 'str', None, 'Other Training Parameters', 'Model name for Megatron to HF weight conversion. Inferred from AutoConfig.from_pretrained(hf_checkpoint) if not set. Here: a conversion family of the raw converter, qwen2, qwen3, llama, qwen3_moe or mixtral (also spelled as slime does, the config class lower-cased: qwen3moe, Qwen3MoeConfig); the Megatron backend builds and converts the model as that family, so a checkpoint whose config.json has another model_type (a renamed derivative) converts as the named one. A name that is no family, or one contradicting a config whose model_type is itself a family, is refused in one line at start; with --train-backend torch (HF models, no conversion) and --megatron-to-hf-mode bridge (megatron-bridge infers its own) only that check runs'),
    F('only-load-weight', 'flag', False, 'Other Training Parameters', 'Reference model and actor fwd only load weights. Here: how they are always built (the flag changes nothing): the torch trainer\'s reference copy (the initial policy, or --ref-load\'s saved model weights) and the reference/actor_fwd services\' forward-only copies (relax/backends/services.py) hold model weights only, no optimizer, RNG or gradient state'),
    F('rlsp-server-port', 'int', 8234, 'Other Training Parameters', 'RLSP Server HTTP port'),
    F('custom-config-path', 'str', None, 'Other Training Parameters', 'Custom parameter YAML config file path. Key-value pairs in file override existing parameters. Here: a key naming a flag (with - or _) is that flag, typed and checked like it; any other key is set on args as it is, for recipes and hooks to read (args.max_turns), and the run names those keys in one notice at start (printed and kept in run.json), with the flag a key is close to (a misspelled flag would otherwise do nothing); keys relax sets itself (notices, sglang_passthrough) are refused'),
    # --- Debug
    F('debug-rollout-only', 'flag', False, 'Debug', 'Run Rollout only, no training. Here: no trainer starts and no weights are synced; the engines keep the --hf-checkpoint weights (version 0) for every rollout; with --save-debug-rollout-data it records rollouts to train on later. Needs --num-rollout or --num-epoch; not with --fully-async or trainer flags (--load, --save, --save-hf)'),
    F('debug-train-only', 'flag', False, 'Debug', 'Run training only, no Rollout. Here: no engines start and no weights are synced; every step trains on the rollout --load-debug-rollout-data holds for it (required); --prompt-data is not read; not with --fully-async or rollout flags (--eval-interval, --partial-rollout, custom generate/rollout functions, ...)'),
    F('load-debug-rollout-data', 'str', None, 'Debug', 'Load debug Rollout data. Automatically enables --debug-train-only when set. Here: files written by --save-debug-rollout-data (docs/artifacts.md); with {rollout_id} step k reads rollout k and --num-rollout defaults to the consecutive files from 0, without it every step reads the one file; a missing or malformed file fails at start, naming it'),
    F('load-debug-rollout-data-subsample', 'float', None, 'Debug', 'Subsample debug Rollout data to accelerate debugging. Here: a fraction in (0, 1]; each step keeps that share of the groups (rounded, at least one), whole groups from the front; the kept samples must still fill whole --global-batch-size batches'),
    F('save-debug-rollout-data', 'str', None, 'Debug', 'Save Rollout data. Path supports {rollout_id} placeholder. Here: every rollout step writes its sample groups as JSON (tokens, loss masks, rollout log-probs, rewards, group and sample indices, weight versions, status; docs/artifacts.md) before training on them, so --load-debug-rollout-data replays them, e.g. under another parallel layout'),
    F('save-debug-train-data', 'str', None, 'Debug', 'Save training data. Path supports {rollout_id} placeholder. Here: rank 0 of the trainer torch.saves each step\'s batch once its advantages are computed: a dict of rollout_id, tokens, response_lengths, rewards, loss_masks, rollout_log_probs, advantages and sample_ids (relax/observability/train_dumps.py documents the format)'),
    F('dump-details', 'str', None, 'Debug', 'Export all training details for post-hoc analysis. Here: DIR/rollout_<step>.jsonl, one JSON line per trained sample: tokens, response_length, reward, and per response token loss_mask, rollout/old/ref log-probs and advantages (null where the step computed none; relax/observability/train_dumps.py)'),
    F('check-weight-update-equal', 'flag', False, 'Debug', 'Check if weight updates are equal'),
    F('enable-cuda-memory-check', 'flag', False, 'Debug', 'Enable memory check around low-level NCCL communication calls. Logs available GPU memory before each collective and attaches memory info to exceptions on failure. Here: each trainer rank reads torch.cuda.mem_get_info() before every collective relax issues (the torch backend\'s gradient, log-prob and metric all-reduces and all-gathers; the Megatron backend\'s weight-export gathers and pipeline broadcasts; the weight-update group\'s broadcasts of --weight-sync-transport distributed), logs it at debug level (logger relax.collectives), and a failing collective raises its own error with a note naming the collective, the rank and the free / total bytes before it and after; each step writes one collective_memory event to events.jsonl (rank 0: collectives run per name, the least free memory seen and where). megatron-core\'s internal collectives (its DDP gradient reduce-scatter, its optimizer) are left to megatron-core. CUDA only: refused at launch on a run without a GPU (relax/observability/collective_memory.py)'),
    # --- Training Performance Profiling
    F('use-pytorch-profiler', 'flag', False, 'Training Performance Profiling', "Enable PyTorch. Here: torch backend (Megatron inherits the same step), on CPU or GPU; one Chrome trace per profiled target, step and rank under <output-dir>/traces/<tb-experiment-name, default the output dir's name>/train_trace/<target>_step<N>_rank<R>.pt.trace.json (relax/observability/profiler.py)'s built-in profiler to record CUDA kernels, CPU ops, and communication during training (from Megatron)"),
    F('profile-step-start', 'int', 10, 'Training Performance Profiling', "Step offset at which to start profiling (inclusive, from Megatron). Counts from 0 since the current training launch, not absolute rollout ID; resets on checkpoint resumption. Here: counts train steps of this launch, as the seed says"),
    F('profile-step-end', 'int', 12, 'Training Performance Profiling', "Step offset at which to stop profiling (inclusive, from Megatron). Same counting semantics as above. E.g. start=10, end=12 profiles steps 10, 11, 12 (3 steps). Here: inclusive"),
    F('profile-target', 'str_list', ['train_overall'], 'Training Performance Profiling', "Profiling targets: train_overall, train_actor, train_log_probs. Here: train_overall is the whole step, train_log_probs the old/reference/teacher log-prob forwards, train_actor the optimizer steps; several may be given", choices=('train_overall', 'train_actor', 'train_log_probs')),
    F('profile-with-stack', 'flag', False, 'Training Performance Profiling', "Record stack information in profiler traces. Here: torch.profiler's with_stack"),
    F('profile-with-memory', 'flag', False, 'Training Performance Profiling', "Record memory information in profiler traces. Here: torch.profiler's profile_memory"),
    F('profile-with-flops', 'flag', False, 'Training Performance Profiling', "Estimate FLOPs in profiler traces. Here: torch.profiler's with_flops (and record_shapes)"),
    # --- GPU Memory Profiling
    F('record-memory-history', 'flag', False, 'GPU Memory Profiling', 'Enable CUDA memory allocation history recording (from Megatron). Records call stacks and tensor info for each allocation/deallocation, and auto-dumps a snapshot on OOM. Here: torch.cuda.memory._record_memory_history from the train backend\'s start (torch and megatron), with a snapshot when a step runs out of memory (relax/observability/memory.py); CUDA only, refused in one line on a run without a GPU. With --memory-recorder memray: memray tracks the trainer process\'s host memory instead, on CPU or GPU'),
    F('memory-snapshot-path', 'str', 'snapshot.pickle', 'GPU Memory Profiling', 'Memory snapshot filename (from Megatron). Here: the file name of each snapshot, prefixed rank<R>_<step<N> or oom_step<N>>_ (with --memory-recorder memray its suffix becomes .bin: memray capture files)'),
    F('memory-snapshot-dir', 'str', None, 'GPU Memory Profiling', 'Memory snapshot output directory. Defaults to traces/<tb_experiment_name>/memory_snapshot. Here: under --output-dir: <output-dir>/traces/<tb-experiment-name or the output dir\'s name>/memory_snapshot'),
    F('memory-snapshot-num-steps', 'int', None, 'GPU Memory Profiling', 'Proactively dump a memory snapshot after the specified number of steps (0-indexed, i.e., setting 3 means dump after step 2). Here: counted in this launch; turns the history on; CUDA only with the torch recorder'),
    F('memory-recorder', 'str', 'torch', 'GPU Memory Profiling', 'Memory recorder backend: torch (PyTorch built-in), memray (requires pip install memray). Here: torch is the CUDA allocator\'s history (GPU only); memray tracks the trainer process\'s host memory (Python and C allocations with their Python stacks) from the backend\'s start, on CPU or GPU, each snapshot a memray capture for memray flamegraph / stats (a dump ends the live capture and starts the next; the one since the last dump stays in rank<R>_live.bin); needs memray installed (relax\'s [memray] extra) and --record-memory-history or --memory-snapshot-num-steps, else refused in one line', choices=('torch', 'memray')),
    # --- Network
    F('http-proxy', 'str', None, 'Network', 'HTTP proxy address. Here: the run\'s calls to outside services go through it (aiohttp proxy=): the --rm-type remote_rm requests to --rm-url (relax/engine/rewards/remote.py) and the --opd-type sglang teacher server at --rm-url (relax/engine/rollout/opd_teacher.py); the run\'s own engines (external ones too), router and trainer calls stay direct'),
    F('use-distributed-post', 'flag', False, 'Network', 'Use distributed POST requests. Here: the run starts one poster Ray actor per rollout engine (spread over the nodes, no CPU reserved) and the rollout\'s POSTs (the default rollout\'s batched /generate shares, and every relax.utils.http_utils.post the driver makes: a --custom-generate-function-path hook\'s, the multi-turn rollout\'s, the remote reward\'s at --rm-url) are made by them in turn, each from its own process and event loop, instead of all from the driver\'s one loop; the requests, answers, retries and errors are those of the default path, so the samples and their order are too. Control calls (abort, pause, weight updates, health) stay on the driver (relax/engine/rollout/distributed_post.py)'),
]

ADDITIONS_GROUP = "Relax harness additions"
ADDED_FLAGS: list[FlagSpec] = [
    F("preset", "str", None, ADDITIONS_GROUP,
      "Named bundle of defaults (relax/utils/presets.py), e.g. quickstart; later flags and --config override it"),
    F("output-dir", "str", None, ADDITIONS_GROUP,
      "Run directory for metrics.jsonl, weights.jsonl, events.jsonl, samples.jsonl, run.json (default runs/<timestamp>)"),
    F("hook-timeout", "float", 300.0, ADDITIONS_GROUP,
      "Seconds one call of a user hook may take: a --custom-rm-path reward function (per sample, or per group "
      "with --group-rm) or a --custom-generate-function-path call. One that does not return in time fails the run "
      "in one line naming the hook (relax/utils/plugins.py bounded); built-in graders are not bounded, but for "
      "--rm-type remote_rm it is the total time of one sample's request to --rm-url, retries included"),
    F("overwrite-output-dir", "flag", False, ADDITIONS_GROUP,
      "Start a new run in an --output-dir that holds a finished run's artifacts, replacing them. Without it that "
      "is refused (resume such a run with --load, which appends to its files); a directory a live run is using is "
      "always refused (relax/metrics/run_dir.py)"),
    F("config", "str", None, ADDITIONS_GROUP,
      "YAML file whose keys are flag names (with - or _); same semantics as --custom-config-path"),
    F("device", "str", "auto", ADDITIONS_GROUP, "Device for the trainer and embedded engines: auto picks cuda when available",
      choices=("auto", "cpu", "cuda")),
    F("gamma", "float", 1.0, ADDITIONS_GROUP,
      "Discount factor for GAE (ppo) and REINFORCE++ returns (slime flag; not in the seed's tables)"),
    F("lambd", "float", 1.0, ADDITIONS_GROUP, "GAE lambda for the ppo estimator (slime flag; not in the seed's tables)"),
    F("ray-address", "str", None, ADDITIONS_GROUP,
      "Ray cluster to join: HOST:PORT of its head (ray start --head --port PORT) or auto (the cluster ray start "
      "runs on this machine). Unset: RAY_ADDRESS when set (ray job submit sets it for its entrypoint, "
      "scripts/entrypoint/local.sh exports it), else the run starts a private single-node Ray cluster that ends "
      "with it. Actors get the worker environment (one thread, offline, RELAX_* variables) through their "
      "runtime_env on every node, and relax must be importable there (installed, or ray job submit "
      "--working-dir). Ray Client addresses (ray://) are refused (relax/distributed/cluster.py)"),
    F("rollout-backend", "str", "embedded", ADDITIONS_GROUP,
      "Rollout engine: embedded (our engine server, relax/backends/embedded/) or sglang (real SGLang servers started "
      "by the run, relax/backends/sglang/; needs sglang installed and CUDA GPUs). Either is driven only through "
      "SGLang's HTTP API (docs/engine_api.md)", choices=("embedded", "sglang")),
    F("ref-actor-config", "json", None, ADDITIONS_GROUP,
      "JSON config overrides for Reference/ActorFwd services (seed 004), the separate lightweight services of the "
      "reference / actor_fwd roles in --resource (--fully-async; relax/core/services.py). Keys: "
      "tensor_model_parallel_size (1), sequence_parallel (false), max_tokens_per_gpu (the services' dynamic-batching "
      "token budget; default: the trainer's micro-batching), only_load_weight (true: forward-only, no optimizer). "
      "Each service is a copy of the trainer's backend: torch, or with --train-backend megatron a one-GPU Megatron "
      "model (its replicas need 1 GPU each) whose weight syncs land in its fused parameters"),
    F("embedded-runner", "str", "auto", ADDITIONS_GROUP,
      "Model runner of the embedded rollout engines: hf (HF modules, DynamicCache), static (HF modules over "
      "preallocated KV slots) or lean (our fused decoder forward, the fast GPU path; the rows of one prompt "
      "admitted together, as GRPO's n samples are, prefill it once and share its KV cache). auto: lean with CUDA graphs "
      "on CUDA, hf on CPU; on CUDA auto falls back to hf (and says so) when lean's preallocated KV cache "
      "(one slot per sample of a rollout step, at most 256, x --rollout-max-context-len, else the model's "
      "max_position_embeddings) would exceed 25% of GPU memory. Rule: relax/backends/embedded/runner_choice.py; "
      "relax serve-engine has its own --runner", choices=("auto", "hf", "static", "lean")),
    F("embedded-cuda-graph", "bool", None, ADDITIONS_GROUP,
      "Capture the engines' decode steps as CUDA graphs (static and lean runners; lean captures sampling too). "
      "Unset: on for static and lean on CUDA, off otherwise; true on CPU or with the hf runner is an error"),
    F("embedded-compile", "flag", False, ADDITIONS_GROUP,
      "torch.compile the lean runner's decode forward before graph capture (faster decode, slower first "
      "steps). Needs a CUDA device and --embedded-runner lean (or auto)"),
    F("weight-sync-transport", "str", "auto", ADDITIONS_GROUP,
      "How each weight sync reaches its targets, always through SGLang's HTTP endpoints (relax/weights/transports/). "
      "tensor: /update_weights_from_tensor with memory the trainer shares: a CUDA IPC handle to its packed GPU "
      "buffer (a target on the trainer's GPU: colocate) or a named shared-memory segment (host weights, a target on "
      "the same machine; relax's engine copies it to its GPU), in SGLang's flattened_bucket format. distributed: "
      "/init_weights_update_group + /update_weights_from_distributed, a broadcast over NCCL (GPU weights) or gloo "
      "(host weights) to targets anywhere. auto: tensor for each one-rank target on the GPU that holds the "
      "trainer's weights at sync time, and for each one-rank relax engine on a GPU of the machine whose host "
      "memory holds them (an offloaded torch trainer colocated with its engines: a copy from shared memory instead "
      "of a gloo broadcast through the loopback); distributed for every other target (every target of a CPU run, "
      "a stock SGLang server given host weights)",
      choices=("auto", "tensor", "distributed")),
    F("fleet-control-addr", "str", None, ADDITIONS_GROUP,
      "HOST:PORT of the run's fleet control endpoint (relax/core/fleet_control.py): POST /scale_out {\"count\": N}, "
      "POST /scale_in {\"indices\": [...]}, GET /fleet. Port 0 picks a free one; the address is a control_endpoint "
      "event in events.jsonl. A host off loopback requires --fleet-control-api-key. Setting it also keeps the last "
      "sync's weights on the host, which a joining engine is given. Unset: no endpoint"),
    F("fleet-control-api-key", "str", None, ADDITIONS_GROUP,
      "API key the fleet control endpoint requires (Authorization: Bearer <key>); required when "
      "--fleet-control-addr is not a loopback address"),
    F("weight-sync-timeout", "float", 60.0, ADDITIONS_GROUP,
      "Seconds one engine call of a weight sync or a memory move may take: /init_weights_update_group, "
      "/update_weights_from_distributed (and the trainer's end of its broadcast), /update_weights_from_tensor, "
      "/weights_checker, /release_memory_occupation, /resume_memory_occupation. One that does not answer in time "
      "fails the run in one line naming the engine (with --use-fault-tolerance: at most max(30, 4 x "
      "--rollout-health-check-timeout) s, then the engine is replaced). docs/waits.md lists every wait"),
    F("no-bias-swiglu-fusion", "flag", False, ADDITIONS_GROUP,
      "Megatron-LM's flag: run the MLP's SwiGLU as separate torch ops instead of megatron-core's fused "
      "bias_swiglu_impl (its torch.compile'd forward and backward kernels; on by default, needs triton). "
      "--train-backend megatron only (relax/backends/megatron/fusions.py)"),
    F("no-bias-dropout-fusion", "flag", False, ADDITIONS_GROUP,
      "Megatron-LM's flag: run the residual bias-dropout-add as separate torch ops instead of megatron-core's "
      "torch.compile'd fused one (on by default, needs triton). --train-backend megatron only "
      "(relax/backends/megatron/fusions.py)"),
    F("no-rope-fusion", "flag", False, ADDITIONS_GROUP,
      "Megatron-LM's flag: run RoPE as megatron-core's separate torch ops instead of one torch.compile'd kernel "
      "forward and one backward (on by default, needs triton; Transformer Engine's fused RoPE when TE is "
      "installed). --train-backend megatron only (relax/backends/megatron/rope_fusion.py)"),
    F("debug", "flag", False, ADDITIONS_GROUP,
      "Print the full traceback when a run fails (also RELAX_DEBUG=1). By default a failure ends with one line "
      "naming the culprit (a hook's dotted path, the sample index, the file and line) and run.json records it"),
    F("sgd-momentum", "float", 0.9, ADDITIONS_GROUP,
      "Megatron-LM's flag: SGD's momentum factor (--optimizer sgd only; refused with adam). 0 is plain SGD."),
    F("lr-wsd-decay-iters", "int", None, ADDITIONS_GROUP,
      "Megatron-LM's flag: the optimizer steps of WSD's anneal, the run's last ones (--lr-decay-style WSD needs it; "
      "refused with any other style). Larger than the run's steps, the anneal has begun before the first step, "
      "as in Megatron-LM."),
    F("lr-wsd-decay-style", "str", "exponential", ADDITIONS_GROUP,
      "Megatron-LM's flag: the shape of WSD's anneal, as a coefficient of its done fraction d: linear 1 - d, cosine "
      "(1 + cos(pi d)) / 2, exponential 2 * 0.5^d - 1, minus_sqrt 1 - sqrt(d). With --lr-decay-style WSD only.",
      choices=("exponential", "linear", "cosine", "minus_sqrt")),
    F("bf16", "flag", False, ADDITIONS_GROUP,
      "Megatron-LM's flag: train in bf16. --train-backend torch: bf16 weights and activations, fp32 master weights "
      "and Adam state in the optimizer, micro-batch gradients accumulated in fp32; the engines hold the same bf16 "
      "weights (the trainer's export dtype). --train-backend megatron always trains this way (implied)"),
]

MODEL_GROUP = "Megatron Model Architecture"
_ARCH = ". Here: checked against --hf-checkpoint's config.json (a mismatch is an error naming both values); " \
        "builds the model when that directory has no config.json (relax/models/arch_flags.py)"
# Megatron-LM's architecture flags, as seed 001's scripts/models/*.sh pass them; defaults are Megatron-LM's
# own unless the help says otherwise.
MODEL_FLAGS: list[FlagSpec] = [F(*row[:4], row[4] + row[5], **(row[6] if len(row) > 6 else {})) for row in (
    ("num-layers", "int", None, MODEL_GROUP, "Number of transformer layers", _ARCH),
    ("hidden-size", "int", None, MODEL_GROUP, "Transformer hidden size", _ARCH),
    ("ffn-hidden-size", "int", None, MODEL_GROUP, "MLP hidden size; when None 4 x hidden-size (with --swiglu "
     "2/3 of that, rounded down to a multiple of 64)", _ARCH),
    ("num-attention-heads", "int", None, MODEL_GROUP, "Number of attention heads", _ARCH),
    ("group-query-attention", "flag", False, MODEL_GROUP, "Grouped-query attention (uses --num-query-groups)", _ARCH),
    ("num-query-groups", "int", 1, MODEL_GROUP, "Key/value head groups with --group-query-attention", _ARCH),
    ("kv-channels", "int", None, MODEL_GROUP, "Head dimension; when None hidden-size / num-attention-heads", _ARCH),
    ("swiglu", "flag", False, MODEL_GROUP, "SwiGLU (SiLU-gated) MLP; without it a GELU MLP, which is not built",
     _ARCH),
    ("normalization", "str", "LayerNorm", MODEL_GROUP, "Normalization layer (RMSNorm is what is built)", _ARCH,
     {"choices": ("LayerNorm", "RMSNorm")}),
    ("norm-epsilon", "float", 1e-5, MODEL_GROUP, "Epsilon of the normalization layers", _ARCH),
    ("position-embedding-type", "str", "learned_absolute", MODEL_GROUP,
     "Position embedding (rope is what is built; --use-rotary-position-embeddings also selects it)", _ARCH,
     {"choices": ("learned_absolute", "rope", "mrope", "relative", "none")}),
    ("use-rotary-position-embeddings", "flag", False, MODEL_GROUP, "Megatron-LM's older spelling of "
     "--position-embedding-type rope", _ARCH),
    ("rotary-base", "int", 10000, MODEL_GROUP, "RoPE base (HF rope_theta)", _ARCH),
    ("rotary-percent", "float", 1.0, MODEL_GROUP, "Share of the head dimension RoPE rotates (1.0 is built)", _ARCH),
    ("vocab-size", "int", None, MODEL_GROUP, "Vocabulary size before padding to --make-vocab-size-divisible-by",
     _ARCH),
    ("make-vocab-size-divisible-by", "int", 128, MODEL_GROUP, "Pad the vocabulary to a multiple of this", _ARCH),
    ("untie-embeddings-and-output-weights", "flag", False, MODEL_GROUP,
     "Separate output layer (HF tie_word_embeddings false); Megatron ties them by default", _ARCH),
    ("disable-bias-linear", "flag", False, MODEL_GROUP, "No biases in linear layers (Megatron adds them by "
     "default; only bias-free layers, plus --add-qkv-bias, are built)", _ARCH),
    ("add-qkv-bias", "flag", False, MODEL_GROUP, "Biases on the q/k/v projections (Qwen2)", _ARCH),
    ("qk-layernorm", "flag", False, MODEL_GROUP, "Normalize q and k per head before RoPE (Qwen3)", _ARCH),
    ("max-position-embeddings", "int", None, MODEL_GROUP, "Longest sequence the model is configured for (HF "
     "max_position_embeddings); when None --seq-length", _ARCH),
    ("seq-length", "int", None, MODEL_GROUP, "Megatron-LM's training sequence length. Here: the default of "
     "--max-position-embeddings when building from flags; with a config.json it must not exceed its "
     "max_position_embeddings", ""),
    ("init-method-std", "float", 0.02, MODEL_GROUP, "Std of the normal weight init (HF initializer_range)", _ARCH),
    ("attention-dropout", "float", 0.0, MODEL_GROUP, "Attention dropout. Megatron-LM's default is 0.1; here "
     "0.0, what RL recipes pass (seed 004) and the only value built: dropout would make two passes over the "
     "same tokens give different log-probs", ""),
    ("hidden-dropout", "float", 0.0, MODEL_GROUP, "Dropout on the residual stream. Megatron-LM's default is 0.1; "
     "here 0.0, the only value built (as --attention-dropout)", ""),
    ("attention-softmax-in-fp32", "flag", False, MODEL_GROUP, "Run the attention softmax in fp32. Here both "
     "backends always do (HF eager/SDPA and the Megatron backend's core attention), so the flag only confirms it",
     ""),
    ("accumulate-allreduce-grads-in-fp32", "flag", False, MODEL_GROUP, "Accumulate and all-reduce gradients in "
     "fp32. Here always so (fp32 training; --bf16 accumulates into fp32 master gradients; the Megatron backend's "
     "DDP buffers are fp32), so the flag only confirms it", ""),
    ("attention-backend", "str", "auto", MODEL_GROUP, "Attention implementation. Here: flash is torch SDPA "
     "(FlashAttention-2 on CUDA, needs a GPU) in both backends; unfused and local are the unfused "
     "matmul-softmax-matmul (HF's eager attention in the torch backend, megatron-core's own DotProductAttention "
     "in the Megatron backend's local spec), on CPU or GPU; auto keeps each model's own choice (SDPA for HF "
     "directories, eager for the tiny CPU presets; relax's SDPA core attention in the Megatron backend). Under "
     "Transformer Engine's spec the value goes to TransformerConfig.attention_backend, as in Megatron-LM. "
     "fused is refused: it is Transformer Engine's fused-attention kernel", "",
     {"choices": ("flash", "fused", "unfused", "local", "auto")}),
)]

# What is implemented so far. A flag not listed here may only keep its documented default;
# a choice flag listed in SUPPORTED_VALUES may only take those values.
SUPPORTED: frozenset[str] = frozenset({
    # images (relax/data/multimodal.py, relax/data/mm_pool.py, relax/backends/embedded/vision_runner.py)
    "multimodal-keys", "image-max-token-num", "image-min-token-num", "image-resize-scale-factor",
    "mm-processor-pool-size", "prefetch-chunk-size", "prefetch-max-cached", "prefetch-num-workers",
    "video-min-token-num", "video-max-token-num", "video-fps", "video-fps-min-frames", "video-fps-max-frames",
    "frame-factor",  # videos as frame lists (relax/data/video_frames.py)
    "audio-sample-rate", "use-audio-in-video",  # audio (relax/data/audio.py, relax/models/omni.py)
    # cluster and checkpoints
    "resource", "num-gpus-per-node", "rollout-num-gpus-per-engine", "ray-address",  # relax/distributed/
    "distributed-timeout-minutes", "colocate", "hf-checkpoint", "load", "save", "save-interval", "save-hf", "no-save-optim",
    "async-save", "rotate-ckpt", "max-actor-ckpt-to-keep", "critic-load", "critic-save",  # relax/core/saver.py
    "start-rollout-id", "opd-teacher-ckpt-step", "ref-ckpt-step",
    "true-on-policy-mode",  # relax/backends/embedded/train_identical.py
    "use-routing-replay", "use-rollout-routing-replay",  # relax/backends/{torch,megatron}/routing_replay.py
    "offload", "offload-train", "offload-rollout",  # colocate offload: relax/core/offload.py
    # data
    "prompt-data", "input-key", "label-key", "metadata-key", "tool-key", "apply-chat-template",
    "apply-chat-template-kwargs", "system-prompt", "rollout-shuffle", "rollout-seed", "rollout-max-prompt-len",
    "data-source-path", "rollout-function-path",
    "use-streaming-dataset", "streaming-buffer-size", "custom-prompt-path",  # relax/data/streaming.py, prompts.py
    # rollout
    "num-rollout", "num-epoch", "rollout-batch-size", "n-samples-per-prompt", "rollout-temperature", "rollout-top-p",
    "rollout-top-k", "rollout-max-response-len", "rollout-max-context-len", "rollout-stop", "rollout-stop-token-ids",
    "rollout-skip-special-tokens", "update-weight-buffer-size",
    # batching and optimizer
    "global-batch-size", "micro-batch-size", "num-steps-per-rollout", "lr", "clip-grad", "seed", "weight-decay",
    "adam-beta1", "adam-beta2", "optimizer", "train-backend",
    "use-dynamic-batch-size", "max-tokens-per-gpu", "log-probs-max-tokens-per-gpu", "log-probs-chunk-size",
    "only-train-params-name-list", "freeze-params-name-list",
    # megatron backend
    "megatron-to-hf-mode", "use-distributed-optimizer", "qkv-format",
    "tensor-model-parallel-size", "pipeline-model-parallel-size", "sequence-parallel", "context-parallel-size",
    "expert-model-parallel-size", "expert-tensor-parallel-size",  # relax/backends/megatron/parallel.py
    "recompute-granularity", "recompute-method", "recompute-num-layers",  # relax/backends/megatron/memory_flags.py
    "optimizer-cpu-offload", "overlap-cpu-optimizer-d2h-h2d", "use-precision-aware-optimizer",
    "overlap-grad-reduce", "overlap-param-gather",  # relax/backends/megatron/backend.py (megatron-core's DDP)
    "no-bias-swiglu-fusion", "no-bias-dropout-fusion", "no-rope-fusion",  # relax/backends/megatron/fusions.py
    # algorithm
    "advantage-estimator", "normalize-advantages", "disable-grpo-std-normalization", "disable-rewards-normalization",
    "eps-clip", "eps-clip-high", "eps-clip-c", "entropy-coef", "use-kl-loss", "kl-loss-coef", "kl-loss-type",
    "calculate-per-token-loss", "disable-compute-advantages-and-returns", "gamma", "lambd", "loss-type",
    "custom-loss-function-path", "sapo-tau-pos", "sapo-tau-neg", "value-clip", "critic-lr", "critic-lr-warmup-iters",
    "num-critic-only-steps", "critic-train-only", "kl-coef", "use-unbiased-kl",
    # off-policy corrections
    "use-rollout-logprobs", "use-tis", "tis-clip", "tis-clip-low", "custom-tis-function-path", "use-opsm", "opsm-delta",
    "get-mismatch-metrics", "custom-pg-loss-reducer-function-path",
    # rewards
    "rm-type", "custom-rm-path", "reward-key", "custom-reward-post-process-path",
    "genrm-model-path", "genrm-num-gpus", "genrm-num-gpus-per-engine", "genrm-engine-config",
    "genrm-sampling-config",  # relax/engine/rewards/genrm.py, relax/core/genrm_engines.py
    # modes
    "update-weights-interval",  # relax/core/runtime.py (sync_due, held_version)
    "keep-old-actor",  # relax/backends/torch/old_actor.py
    "recompute-loss-function",  # relax/backends/torch/backend.py (_recomputed_loss)
    "train-memory-margin-bytes",  # relax/backends/torch/memory_margin.py
    "model-name",  # relax/backends/megatron/config.py (model_family)
    "disable-weights-backuper",  # relax/core/runtime.py (push_options), relax/utils/validation.py
    "checkpoint-engine-backend",  # the distributed weight-sync transport's broadcast (group_backend)
    "reset-optimizer-states", "use-rollout-entropy", "ref-update-interval",  # relax/backends/torch/backend.py
    "train-env-vars",  # relax/distributed/placement.py
    "eval-min-new-tokens", "eval-max-context-len",  # relax/engine/rollout/evaluation.py
    "num-iters-per-train-update", "ref-actor-config",  # PPO epochs; fully-async services (relax/core/services.py)
    "fully-async", "max-staleness", "num-data-storage-units", "polling-mode", "use-opd", "opd-type", "opd-kl-coef", "opd-teacher-load",
    "debug-rollout-only", "debug-train-only", "save-debug-rollout-data", "load-debug-rollout-data",
    "load-debug-rollout-data-subsample",  # replayable rollouts: relax/core/debug_rollouts.py
    "check-weight-update-equal", "custom-generate-function-path", "group-rm", "rm-url",
    "over-sampling-batch-size", "dynamic-sampling-filter-path",
    "partial-rollout", "partial-rollout-max-aborted-count", "mask-offpolicy-in-partial-rollout", "buffer-filter-path",
    "custom-convert-samples-to-train-data-path", "rollout-data-postprocess-path",
    # evaluation
    "eval-interval", "eval-prompt-data", "n-samples-per-eval-prompt", "eval-temperature", "eval-top-p", "eval-top-k",
    "eval-max-response-len", "eval-max-prompt-len", "skip-eval-before-train", "eval-input-key", "eval-label-key",
    "eval-tool-key", "eval-reward-key", "log-passrate", "eval-function-path",  # relax/core/eval_function.py
    "eval-config",  # relax/engine/rollout/eval_file.py
    "http-proxy",  # relax/engine/rewards/remote.py
    "distributed-backend",  # relax/distributed/trainer_group.py
    "only-load-weight",  # always so: relax/backends/torch/backend.py (_reference_model), relax/backends/services.py
    # fault tolerance
    "use-fault-tolerance", "use-health-check", "max-global-restart", "rollout-health-check-interval",
    "rollout-health-check-timeout", "rollout-health-check-first-wait",
    # elastic fleet (relax/core/elastic.py, relax/core/fleet_control.py)
    "scale-out-timeout", "scale-out-partial-success-policy", "scale-in-drain-timeout", "scale-in-shutdown-timeout",
    "fleet-control-addr", "fleet-control-api-key",
    "autoscaler-config",  # relax/core/autoscaler.py, relax/utils/autoscaler/
    # logging and config
    "use-tensorboard", "tb-project-name", "tb-experiment-name", "custom-config-path", "use-metrics-service",
    "timeline-dump-dir", "use-pytorch-profiler", "profile-step-start", "profile-step-end", "profile-target",
    "profile-with-stack", "profile-with-memory", "profile-with-flops",  # relax/observability/
    "log-multi-turn", "log-correct-samples", "log-reward-category", "custom-rollout-log-function-path",
    "record-memory-history", "memory-snapshot-path", "memory-snapshot-dir", "memory-snapshot-num-steps",
    "memory-recorder",  # relax/observability/memory.py
    "enable-cuda-memory-check",  # relax/observability/collective_memory.py
    "custom-model-provider-path",  # relax/models/provider.py
    "use-distributed-post",  # relax/engine/rollout/distributed_post.py
    "balance-data",  # relax/backends/torch/data_parallel.py
    # additions
    "preset", "output-dir", "overwrite-output-dir", "hook-timeout", "lr-decay-style", "lr-wsd-decay-iters",
    "lr-wsd-decay-style", "sgd-momentum", "config", "device", "rollout-backend",
    # engines (relax/core/engine_launchers.py, relax/backends/sglang/), the router (relax/engine/router/)
    "rollout-external", "rollout-external-engine-addrs", "sglang-mem-fraction-static",
    "slime-router-timeout", "slime-router-max-connections", "slime-router-health-check-failure-threshold",
    "use-slime-router", "slime-router-middleware-paths",  # the text router (relax/engine/router/middleware.py)
    "embedded-runner", "embedded-cuda-graph", "embedded-compile", "weight-sync-transport", "weight-sync-timeout",
    "debug", "bf16",
    "sglang-profile", "sglang-profile-steps", "sglang-profile-step-start", "sglang-profile-step-end",
    "sglang-profile-output-dir", "sglang-profile-num-steps", "sglang-profile-activities", "sglang-profile-by-stage",
    "sglang-profile-with-stack", "sglang-profile-record-shapes",  # relax/observability/sglang_profile.py
    "notify-urls", "use-clearml",  # relax/observability/notify.py, relax/metrics/clearml_logger.py
    "save-debug-train-data", "dump-details",  # relax/observability/train_dumps.py
    "custom-eval-rollout-log-function-path",  # relax/core/eval_log_hook.py
    # Megatron model architecture (relax/models/arch_flags.py); ref-load naming the --hf-checkpoint directory
    *(spec.name for spec in MODEL_FLAGS), "ref-load",
})
SUPPORTED_VALUES: dict[str, frozenset[Any]] = {
    "opd-type": frozenset({"megatron", "sglang"}),  # megatron: the training backend's teacher (torch on CPU);
    # sglang: a teacher engine server at --rm-url, or an embedded one over --opd-teacher-load (opd_teacher.py)
    "advantage-estimator": frozenset({"grpo", "gspo", "sapo", "cispo", "rloo", "reinforce_plus_plus",
                                      "reinforce_plus_plus_baseline", "ppo", "on_policy_distillation"}),
    "train-backend": frozenset({"torch", "megatron"}),  # megatron: TP x PP x EP x DP over the trainer's ranks
    "rollout-backend": frozenset({"embedded", "sglang"}),
    "distributed-backend": frozenset({"nccl", "gloo"}),
    "checkpoint-engine-backend": frozenset({"nccl", "gloo"}),  # relax/weights/transports/distributed.py
    "attention-backend": frozenset({"auto", "flash", "unfused", "local"}),
    "attention-dropout": frozenset({0.0}), "hidden-dropout": frozenset({0.0}), "rotary-percent": frozenset({1.0}),
}


# Value ranges, checked at parse time for a value that is set (None keeps its "when None" meaning). Counts and
# sizes whose rules need more than a range (divisibility, cross-flag) are checked in relax/utils/validation.py.
BOUNDS: dict[str, Bound] = {
    "lr": NON_NEGATIVE, "critic-lr": NON_NEGATIVE, "weight-decay": NON_NEGATIVE,  # lr 0: gradients without updates
    "adam-beta1": BETA, "adam-beta2": BETA, "clip-grad": NON_NEGATIVE,
    "eps-clip": POSITIVE, "eps-clip-high": POSITIVE,  # --eps-clip-c: AlgorithmConfig.validate (> 1)
    "entropy-coef": NON_NEGATIVE, "kl-coef": NON_NEGATIVE, "kl-loss-coef": NON_NEGATIVE, "opd-kl-coef": NON_NEGATIVE,
    "value-clip": POSITIVE,  # --gamma, --lambd, --sapo-tau-*: AlgorithmConfig.validate
    "rollout-temperature": NON_NEGATIVE, "eval-temperature": NON_NEGATIVE,
    "rollout-top-p": PROBABILITY_OPEN, "eval-top-p": PROBABILITY_OPEN,
    "rollout-max-response-len": AT_LEAST_1, "rollout-max-prompt-len": AT_LEAST_1,
    "rollout-max-context-len": AT_LEAST_1, "update-weight-buffer-size": POSITIVE,
    "num-gpus-per-node": AT_LEAST_1, "rollout-num-gpus-per-engine": AT_LEAST_1, "distributed-timeout-minutes": POSITIVE,
    "num-data-storage-units": AT_LEAST_1, "max-staleness": NON_NEGATIVE, "num-iters-per-train-update": AT_LEAST_1,
    "input-key": NONEMPTY, "label-key": NONEMPTY, "metadata-key": NONEMPTY, "tool-key": NONEMPTY,
    "n-samples-per-eval-prompt": AT_LEAST_1, "eval-interval": AT_LEAST_1,
    "rollout-health-check-interval": POSITIVE, "rollout-health-check-timeout": POSITIVE,
    "max-global-restart": NON_NEGATIVE, "hook-timeout": POSITIVE, "weight-sync-timeout": POSITIVE,
    "genrm-num-gpus": AT_LEAST_1, "genrm-num-gpus-per-engine": AT_LEAST_1,
    "slime-router-timeout": POSITIVE, "streaming-buffer-size": AT_LEAST_1,
    "scale-out-timeout": POSITIVE, "scale-in-drain-timeout": NON_NEGATIVE, "scale-in-shutdown-timeout": POSITIVE,
    "max-actor-ckpt-to-keep": AT_LEAST_1, "start-rollout-id": NON_NEGATIVE,
    "opd-teacher-ckpt-step": NON_NEGATIVE, "ref-ckpt-step": NON_NEGATIVE, "update-weights-interval": AT_LEAST_1,
    "ref-update-interval": AT_LEAST_1, "lr-wsd-decay-iters": AT_LEAST_1, "sgd-momentum": NON_NEGATIVE, "eval-min-new-tokens": NON_NEGATIVE, "eval-max-context-len": AT_LEAST_1,
}


# why an unsupported flag cannot be built here yet, when something outside relax rules it out
NOT_YET_WHY: dict[str, str] = {
    "attention-backend": "fused is Transformer Engine's fused-attention kernel, and no transformer-engine build is "
                         "installed on our machines",
    "allgather-cp": "context parallelism: megatron-core runs it only in Transformer Engine's attention, and no "
                    "transformer-engine build is installed on our machines",
}


def _finalize(spec: FlagSpec) -> FlagSpec:
    return replace(spec, supported=spec.name in SUPPORTED, supported_values=SUPPORTED_VALUES.get(spec.name),
                   bound=BOUNDS.get(spec.name), not_yet_why=NOT_YET_WHY.get(spec.name))


FLAGS: list[FlagSpec] = [_finalize(f) for f in SEED_FLAGS + ADDED_FLAGS + MODEL_FLAGS]
FLAGS_BY_NAME: dict[str, FlagSpec] = {f.name: f for f in FLAGS}
_unknown_bounds = sorted(set(BOUNDS) - set(FLAGS_BY_NAME))
if _unknown_bounds:
    raise ValueError(f"BOUNDS names flags that do not exist: {', '.join(_unknown_bounds)}")
