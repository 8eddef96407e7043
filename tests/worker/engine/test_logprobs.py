"""Logprobs per generated token: the model's own log-softmax, as transformers computes it over the same
checkpoint (float32, atol 1e-4 on values of order 1-10), with vLLM's rank and the likeliest alternatives
in order, unchanged by the controls that reshape the sampler's logits, in batches that mix rows that
ask with rows that do not; and each bad value refused naming the parameter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.common.errors import InvalidArgument
from services.common.sampling import MAX_LOGPROBS, SamplingParams
from services.worker.engine import LLM
from services.worker.engine.logprobs import StepLogprobs
from services.worker.engine.sequence import Sequence
from tests.worker.engine.reference import hf_model, mixed_prompts

ATOL = 1e-4  # float32 forward passes of different kernels agree to ~1e-5 here


def _hf_logprobs(model_dir: Path, prompt: list[int], output: list[int]) -> torch.Tensor:
    """transformers' log-softmax at each generated position: [len(output), V]."""
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        logits = hf_model(model_dir)(ids).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) + len(output) - 1].log_softmax(dim=-1)


SETTINGS = {  # name -> params; every row generates 10 tokens past EOS
    "greedy, top 5": SamplingParams(temperature=0.0, logprobs=5),
    "sampled, top 0": SamplingParams(temperature=0.9, top_p=0.8, seed=3, logprobs=0),
    "penalised, top 20": SamplingParams(
        temperature=0.0, logprobs=MAX_LOGPROBS, repetition_penalty=1.7, frequency_penalty=1.0
    ),
    # min_tokens bans its stop ids (a fifth of the vocabulary here) for all 10 tokens.
    "biased + banned, top 3": SamplingParams(
        temperature=1.3, seed=4, logprobs=3, logit_bias={7: 8.0}, min_tokens=10, stop_token_ids=range(3, 100)
    ),
    "no logprobs": SamplingParams(temperature=0.0),
}


def test_logprobs_match_transformers_log_softmax_in_a_mixed_batch(llama_gqa_dir: Path) -> None:
    llm = LLM(llama_gqa_dir, max_num_batched_tokens=64, max_num_seqs=8)  # chunked prefills share steps
    settings = [
        SamplingParams(**{**p.__dict__, "max_tokens": 10, "ignore_eos": True}) for p in SETTINGS.values()
    ]
    prompts = mixed_prompts(len(settings), vocab=512, seed=9, lengths=[3, 70, 20, 120, 9])
    outputs = llm.generate(prompts, settings)
    for name, prompt, params, out in zip(SETTINGS, prompts, settings, outputs, strict=True):
        if params.logprobs is None:
            assert out.logprobs is None, name
            continue
        assert [lp.token_id for lp in out.logprobs] == out.token_ids, name
        reference = _hf_logprobs(llama_gqa_dir, prompt, out.token_ids)
        for position, (lp, row) in enumerate(zip(out.logprobs, reference, strict=True)):
            where = f"{name}, token {position}"
            assert lp.logprob == pytest.approx(float(row[lp.token_id]), abs=ATOL), where
            likelier = int((row > row[lp.token_id] + ATOL).sum())
            assert likelier + 1 <= lp.rank <= int((row > row[lp.token_id] - ATOL).sum()) + 1, where
            # The alternatives: the reference's k largest values, each the reference's value of its token
            # (so they are the top k up to exact ties), likeliest first.
            assert len(lp.top) == params.logprobs, where
            values = [v for _, v in lp.top]
            torch.testing.assert_close(
                torch.tensor(values), row.topk(params.logprobs).values, atol=ATOL, rtol=0
            )
            assert all(abs(v - float(row[t])) <= ATOL for t, v in lp.top), where
            assert values == sorted(values, reverse=True), where


def test_the_controls_do_not_change_the_reported_logprobs() -> None:
    # One row of logits, sampled with and without controls that reshape it: the same logprobs.
    logits = torch.randn(1, 32, generator=torch.Generator().manual_seed(0)) * 4
    plain = Sequence("a", [1, 2], SamplingParams(temperature=0.0, logprobs=4))
    controlled = Sequence("b", [1, 2], SamplingParams(temperature=0.0, logprobs=4, logit_bias={5: 50.0}))
    for seq in (plain, controlled):
        step = StepLogprobs.capture(logits.clone(), [seq])
        assert step is not None
        step.record([5])
    assert plain.logprob == controlled.logprob
    expected = logits[0].log_softmax(dim=-1)
    assert plain.logprob.logprob == pytest.approx(float(expected[5]), abs=1e-6)
    assert plain.logprob.rank == int((expected > expected[5]).sum()) + 1
    assert [t for t, _ in plain.logprob.top] == expected.topk(4).indices.tolist()


def test_a_step_where_no_row_asks_captures_nothing() -> None:
    assert StepLogprobs.capture(torch.zeros(2, 8), [Sequence("a", [1], SamplingParams())] * 2) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 2.5}, "logprobs"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
    ],
)
def test_out_of_range_values_name_the_parameter(fields: dict, param: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        SamplingParams(**fields)
    assert raised.value.field == param
