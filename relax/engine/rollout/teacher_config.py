"""The typed slice of flags the OPD teacher server reads (``--opd-type sglang``, relax/engine/rollout/opd_teacher.py):
where the teacher runs and the temperature its log-probs are taken at.

Built once by the driver (relax/core/runtime.py) with ``TeacherConfig.from_args(args)`` (relax/utils/flag_slice.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.utils.flag_slice import FlagSlice


@dataclass(frozen=True)
class TeacherConfig(FlagSlice):
    # where: a server the user runs (--rm-url), else an embedded one over --opd-teacher-load seeded by --seed
    rm_url: str | None
    http_proxy: str | None  # --rm-url's server is reached through it (an embedded teacher is not)
    opd_teacher_load: str | None
    seed: int
    # the student's sampling temperature: the teacher divides its logits by it, as the trainer does
    rollout_temperature: float

    def validate(self) -> None:
        if not self.rm_url and not self.opd_teacher_load:
            raise ValueError("--opd-type sglang needs a teacher: --rm-url (a running server) or --opd-teacher-load")
