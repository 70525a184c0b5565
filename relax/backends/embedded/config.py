"""The typed slice of flags an embedded engine of a training run reads (relax/distributed/engine_actor.py).

Built once from the run's flags and handed to each `EngineActor`: which model, in which dtype (the trainer's
export dtype, so both sides' checksums agree), how long a context, and which runner
(relax/backends/embedded/runner_choice.py) with how many request slots. The standalone ``relax serve-engine``
server has its own flags and slice (relax/backends/embedded/serve_config.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.data.mm_config import DEFAULT_SAMPLE_RATE
from relax.utils.flag_slice import FlagSlice


@dataclass(frozen=True)
class EmbeddedEngineConfig(FlagSlice):
    # the model, built as the trainer exports it
    hf_checkpoint: str
    train_backend: str
    bf16: bool
    seed: int
    rollout_max_context_len: int | None
    # the runner (None: decided on the device) and the run's device flag it is checked against
    device: str
    embedded_runner: str
    embedded_cuda_graph: bool | None
    embedded_compile: bool
    # the request slots of the preallocating runners: one per sample of a rollout step
    rollout_batch_size: int
    over_sampling_batch_size: int | None
    n_samples_per_prompt: int
    # finished requests' log-probs by the trainer's computation (relax/backends/embedded/train_identical.py)
    true_on_policy_mode: bool
    # the rate audio_data is resampled to before its features (the data loader's, relax/data/audio.py)
    audio_sample_rate: int | None = None

    @property
    def sample_rate(self) -> int:
        """--audio-sample-rate, the seed's 16000 when not set."""
        return DEFAULT_SAMPLE_RATE if self.audio_sample_rate is None else self.audio_sample_rate
