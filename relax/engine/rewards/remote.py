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
    from relax.utils.http_utils import EngineError, post

    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label,
               "metadata": sample.metadata}
    try:
        return await post(args.rm_url, payload, max_retries=RETRIES, timeout=args.hook_timeout, total=args.hook_timeout,
                          proxy=args.http_proxy)
    except EngineError as exc:
        raise EngineError(args.rm_url, f"reward of sample index {sample.index} (--hook-timeout "
                                       f"{args.hook_timeout:g} s): {exc.message}") from None
