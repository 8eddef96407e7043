"""check_stop over a table of token/parameter cases."""

from __future__ import annotations

import pytest

from services.common.sampling import SamplingParams
from services.worker.engine.sequence import FinishReason, Sequence
from services.worker.engine.stopping import check_stop

EOS = 2
PROMPT = [5, 6, 7]


def seq_with(outputs: list[int], params: dict[str, object], prompt: list[int] = PROMPT) -> Sequence:
    seq = Sequence("r", prompt, SamplingParams(**params), eos_token_ids=frozenset({EOS}))  # type: ignore[arg-type]
    seq.token_ids.extend(outputs)
    return seq


@pytest.mark.parametrize(
    ("outputs", "params", "max_model_len", "expected"),
    [
        ([9], {}, 100, None),
        ([EOS], {}, 100, FinishReason.STOP),
        ([EOS], {"ignore_eos": True}, 100, None),
        ([9, 4], {"stop_token_ids": [4]}, 100, FinishReason.STOP),
        ([4], {"stop_token_ids": [4], "ignore_eos": True}, 100, FinishReason.STOP),
        ([9, 9], {"max_tokens": 2}, 100, FinishReason.LENGTH),
        ([9], {"max_tokens": 2}, 100, None),
        ([EOS], {"max_tokens": 1}, 100, FinishReason.STOP),  # STOP wins when both hold
        ([9], {}, 4, FinishReason.LENGTH),  # 3 prompt + 1 output fills the context
        ([9], {}, 5, None),
        ([EOS, 9], {"ignore_eos": True, "max_tokens": 2}, 100, FinishReason.LENGTH),
    ],
)
def test_check_stop(
    outputs: list[int], params: dict[str, object], max_model_len: int, expected: FinishReason | None
) -> None:
    assert check_stop(seq_with(outputs, params), max_model_len) is expected


def test_prompt_ending_in_eos_does_not_stop() -> None:
    assert check_stop(seq_with([], {}, prompt=[5, EOS]), 100) is None
