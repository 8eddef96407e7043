"""Token-level stop rules, checked once per generated token. Stop strings live in the detokenizer."""

from __future__ import annotations

from services.worker.engine.sequence import FinishReason, Sequence


def check_stop(seq: Sequence, max_model_len: int) -> FinishReason | None:
    """Why seq must finish after its last generated token was appended; None means keep going.

    STOP for an EOS id (unless params.ignore_eos) or a params.stop_token_ids id; LENGTH once
    params.max_tokens new tokens exist or the sequence holds max_model_len tokens. Token ids only
    count when they were generated, so a prompt that happens to end in EOS does not stop at once.
    """
    params = seq.params
    if seq.num_output_tokens > 0:
        last = seq.token_ids[-1]
        if last in seq.eos_token_ids and not params.ignore_eos:
            return FinishReason.STOP
        if last in params.stop_token_ids:
            seq.stop_reason = last  # as vLLM reports it; an EOS id leaves it None
            return FinishReason.STOP
    if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None
