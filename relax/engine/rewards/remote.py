"""``--rm-type remote_rm``: score each sample by POSTing it to ``--rm-url`` (Relax/slime payload).

Payload ``{"prompt", "response", "label", "metadata"}``; the service answers a JSON number or
object (then ``--reward-key`` selects the value). Connection errors and 5xx are retried a few
times; a service that stays down ends the run with an error naming the URL. One sample's request, retries
included, takes at most ``--hook-timeout`` seconds: a service that accepts the connection and never answers
ends the run too, in one line naming the URL and the sample. With ``--http-proxy`` the requests go through
that HTTP proxy.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from relax.utils.types import Sample

RETRIES = 3


# seed hook: seed 001 (reward_func(args, sample)), as --rm-type remote_rm
async def remote_rm(args: Namespace, sample: Sample) -> Any:
    """POST {prompt, response, label, metadata} to ``--rm-url``; its JSON answer (a number, or an object for
    ``--reward-key``) is the reward. Connection errors and 5xx answers are retried."""
    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label,
               "metadata": sample.metadata}
    return await post_for_sample(args.rm_url, payload, sample, args.hook_timeout, proxy=args.http_proxy)


async def post_for_sample(url: str, payload: Any, sample: Sample, hook_timeout: float, *, proxy: str | None = None,
                          name: str | None = None, headers: dict[str, str] | None = None) -> Any:
    """One sample's scoring request, the remote reward rule: up to ``RETRIES`` retries of connection errors and
    5xx answers, ``hook_timeout`` seconds in all; an `EngineError` naming ``name`` (else ``url``) and the sample
    when it still fails. The GenRM judge (relax/engine/rewards/genrm.py) posts through it too."""
    from relax.utils.http_utils import EngineError, post

    try:
        return await post(url, payload, max_retries=RETRIES, timeout=hook_timeout, total=hook_timeout, proxy=proxy,
                          headers=headers)
    except EngineError as exc:
        raise EngineError(name or url, f"reward of sample index {sample.index} (--hook-timeout "
                                       f"{hook_timeout:g} s): {exc.message}") from None
