"""Engine-hook faults: the engine honours ``RELAX_FAULT_*`` variables; the spec only sets them."""

from __future__ import annotations

from typing import Literal

from harness.faults.base import FaultParams, FaultRecorder, register

HOOK_ENV = {
    "reward_raise": "RELAX_FAULT_REWARD_RAISE_AT_STEP",
    "nan_loss": "RELAX_FAULT_NAN_LOSS_AT_STEP",
    "ckpt_write_fail": "RELAX_FAULT_CKPT_WRITE_FAIL_AT_STEP",
}


@register("engine_hook")
class EngineHookFault(FaultParams):
    kind: Literal["engine_hook"] = "engine_hook"
    hook: Literal["reward_raise", "nan_loss", "ckpt_write_fail"]
    at_step: int

    def env(self) -> dict[str, str]:
        return {HOOK_ENV[self.hook]: str(self.at_step)}

    def start(self, recorder: FaultRecorder) -> dict[str, str]:
        recorder.record(kind=self.kind, hook=self.hook, step=self.at_step, armed=True, env=self.env())
        return {}
