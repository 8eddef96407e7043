"""The serving stack's fixed cost per request (the gateway, its call to the placer, the worker's RPC and
tokenizing), which the fidelity run adds to every simulated request (fleet.NetworkCosts.
request_overhead_s), measured on the calibration trace's embeddings: an embedding is that cost plus one
encode, and nothing else of the request's path waits on the engine.

Two ways, the first where the run kept what it needs:
- logged_overhead_s: each embedding's time less the encode its worker logged for it (the encoder's
  step log: the step of its token count within its wait). This measures the cost itself: 4.0-4.8 ms
  on fidelity run 23's two traces, idle decoders or working ones alike, and 4.7-5.5 ms over the
  calibration traces of runs 23-26.
- modelled_overhead_s: each embedding's time less its encode as the simulated engine charges it. This
  reproduces the calibration trace's median, but takes in whatever the encode model misses: 11-28 ms
  over run 16's five calibration traces, when the encoder kept its offline fit (about half what a
  serving encode takes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from sim.profiles import ModelCost

CLOCK_SLACK_S = 0.05  # the client's time 0 is read a moment after the wall clock the logs are stamped by
MIN_MATCHED = 5  # fewer embeddings lined up with their encodes measure nothing


def logged_overhead_s(
    embeddings: Iterable[tuple[float, float, int]], encodes: Sequence[Mapping[str, object]]
) -> float | None:
    """The median of each embedding's (sent at, in wall-clock seconds; seconds to its answer; input
    tokens) time less the seconds of the one encode of one input and as many tokens that ran within its
    wait (encodes: the encoder step-log records of every worker). Embeddings with no such encode, or
    more than one, are left out; None when fewer than MIN_MATCHED are left. Never below 0."""
    spans = [
        (float(r["end"]) - float(r["seconds"]), float(r["end"]), float(r["seconds"]), int(r["prefill"]))  # type: ignore[arg-type, call-overload]
        for r in encodes
        if int(r.get("inputs", 1)) == 1  # type: ignore[call-overload]
    ]
    rest = []
    for sent, seconds, tokens in embeddings:
        answered = sent + seconds
        mine = [
            took
            for start, end, took, n in spans
            if n == tokens and start >= sent - CLOCK_SLACK_S and end <= answered + CLOCK_SLACK_S
        ]
        if len(mine) == 1:
            rest.append(seconds - mine[0])
    return max(0.0, float(np.median(rest))) if len(rest) >= MIN_MATCHED else None


def modelled_overhead_s(
    embeddings: Iterable[tuple[int, float, bool]], encoder: ModelCost, core_share: float, wait_s: float = 0.0
) -> float:
    """From embeddings as a caller saw them ((input tokens, seconds from send to answer, whether a
    decoder worked beside it) each: fidelity.embeddings_beside_decoders): the median of each one's time
    less its encode as the simulated engine charges it (the fitted costs, over core_share and after
    wait_s beside a working decoder), so that the simulation reproduces the median of the trace it is
    fitted on. 0 without embeddings; never below 0."""
    rest = [
        seconds - (wait_s + encode / core_share if beside else encode)
        for tokens, seconds, beside in embeddings
        for encode in (encoder.base_s + tokens * encoder.per_prefill_token_s,)
    ]
    return max(0.0, float(np.median(rest))) if rest else 0.0
