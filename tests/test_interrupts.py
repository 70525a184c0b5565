"""relax/utils/interrupts.py: the first SIGINT / SIGTERM raises `Interrupted` once; later ones only hurry."""

from __future__ import annotations

import os
import signal

import pytest

from relax.utils import interrupts


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_first_signal_raises_once_and_later_ones_only_hurry(sig, code) -> None:
    before = signal.getsignal(sig)
    with interrupts.interruptible():
        with pytest.raises(interrupts.Interrupted) as caught:
            os.kill(os.getpid(), sig)  # the handler runs at the next bytecode of this thread
        assert caught.value.exit_code == code and caught.value.name == signal.Signals(sig).name
        assert interrupts.received().name == caught.value.name and not interrupts.hurried()
        os.kill(os.getpid(), sig)  # a second signal during the shutdown raises nothing
        assert interrupts.hurried()
    assert signal.getsignal(sig) is before  # the previous handler is back
