"""Logit bias, the repetition / frequency / presence penalties and min-p: each agrees with its reference
(transformers' logits processors where it has one, OpenAI's formula where it does not) in a batch that
mixes them with rows asking for none, which stay untouched; greedy generation with a repetition
penalty equals transformers' generate; penalties count the tokens generated so far, step after step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from services.common.errors import InvalidArgument
from services.common.sampling import SamplingParams
from services.worker.engine import LLM
from services.worker.engine.errors import InvalidRequestError
from services.worker.engine.sampler import Sampler, _min_p
from services.worker.engine.sequence import Sequence
from tests.worker.engine.reference import hf_model, mixed_prompts

VOCAB = 64
ROWS = {  # name -> (params, prompt, output so far)
    "none": (SamplingParams(temperature=0.0), [1, 2, 3], [4, 4]),
    "repetition 1.5": (SamplingParams(temperature=0.0, repetition_penalty=1.5), [5, 6, 7, 5], [8, 8, 9]),
    "repetition 0.7": (SamplingParams(temperature=0.0, repetition_penalty=0.7), [10, 11], [12]),
    "frequency + presence": (
        SamplingParams(temperature=0.0, frequency_penalty=0.8, presence_penalty=-0.5),
        [13, 14],  # the prompt does not count for these two
        [15, 15, 15, 16, 13],
    ),
    "all three": (
        SamplingParams(temperature=0.0, repetition_penalty=1.2, frequency_penalty=-1.0, presence_penalty=2.0),
        [17, 18],
        [18, 19, 19],
    ),
    "bias": (SamplingParams(temperature=0.0, logit_bias={20: 5.0, 21: -100.0, 3: 0.5}), [1], []),
}


def _seq(name: str) -> Sequence:
    params, prompt, output = ROWS[name]
    seq = Sequence(name, prompt, params)
    seq.token_ids.extend(output)
    return seq


def _reference(logits: torch.Tensor, name: str) -> torch.Tensor:
    """One row as transformers' RepetitionPenaltyLogitsProcessor (over prompt + output) and OpenAI's
    frequency / presence formula (over the output) and logit_bias define it."""
    params, prompt, output = ROWS[name]
    row = logits.clone().unsqueeze(0)
    for token, bias in params.logit_bias:
        row[0, token] += bias
    if params.repetition_penalty != 1.0:
        row = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(
            torch.tensor([prompt + output]), row
        )
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=VOCAB).float()
    row[0] -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return row[0]


def test_bias_and_penalties_match_their_references_row_by_row() -> None:
    names = list(ROWS)
    logits = torch.randn(len(names), VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    controlled = logits.clone()
    Sampler(torch.device("cpu"), seed=0).controls.apply(controlled, [_seq(n) for n in names])
    for i, name in enumerate(names):
        torch.testing.assert_close(controlled[i], _reference(logits[i], name), rtol=1e-6, atol=1e-6, msg=name)
    assert torch.equal(controlled[0], logits[0])  # a row asking for nothing is untouched


def test_penalties_count_each_sampled_token_from_then_on() -> None:
    # Greedy under a strong frequency penalty: once sampled, a token drops by 2 a time and others win.
    sampler = Sampler(torch.device("cpu"), seed=0)
    seq = Sequence("r", [1, 2], SamplingParams(temperature=0.0, frequency_penalty=2.0))
    flat = torch.zeros(1, 4)
    flat[0, 0] = 3.0  # token 0 leads by 3, then 1 and 2 and 3 tie at 0
    chosen = []
    for _ in range(4):
        token = sampler.sample(flat.clone(), [seq])[0]
        seq.token_ids.append(token)
        chosen.append(token)
    assert chosen == [0, 0, 1, 2]  # 3 -> 1 -> -1: after two picks token 0 trails the untouched ones
    sampler.release("r")
    assert sampler.sample(flat.clone(), [Sequence("s", [0], seq.params)]) == [0]  # a fresh count


def test_min_p_drops_what_transformers_drops() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1)) * 2
    params = [SamplingParams(min_p=0.05), SamplingParams(min_p=0.3), SamplingParams()]
    ours = _min_p(logits, params)
    for i, p in enumerate(params[:2]):
        theirs = MinPLogitsWarper(p.min_p)(torch.zeros(1, 1, dtype=torch.long), logits[i : i + 1].clone())[0]
        assert torch.equal(torch.isinf(ours[i]), torch.isinf(theirs)), p.min_p
    assert torch.equal(ours[2], logits[2])


def test_min_p_of_one_samples_only_the_likeliest() -> None:
    sampler = Sampler(torch.device("cpu"), seed=3)
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(2))
    seq = Sequence("r", [1], SamplingParams(temperature=1.5, min_p=1.0))
    assert {sampler.sample(logits.clone(), [seq])[0] for _ in range(50)} == {int(logits.argmax())}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"min_p": 1.1}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"logit_bias": {5: 101.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {"five": 1.0}}, "logit_bias"),
    ],
)
def test_out_of_range_controls_name_the_parameter(fields: dict, param: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        SamplingParams(**fields)
    assert raised.value.field == param


def test_a_bias_outside_the_vocabulary_is_refused(llama_gqa_dir: Path) -> None:
    llm = LLM(llama_gqa_dir)
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        llm.engine.add_request("r", [5, 6], SamplingParams(logit_bias={10**6: 1.0}))
    assert not llm.engine.has_unfinished_requests()


def _hf_penalised(model_dir: Path, prompt: list[int], params: SamplingParams, new: int) -> list[int]:
    """transformers' greedy generate with repetition_penalty, then OpenAI's frequency / presence formula
    applied step by step over the same model's logits (transformers has no processor for those two)."""
    model = hf_model(model_dir)
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(new):
            logits = model(torch.tensor([ids])).logits[0, -1:].float()
            if params.repetition_penalty != 1.0:
                logits = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(
                    torch.tensor([ids]), logits
                )
            output = ids[len(prompt) :]
            counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=logits.shape[1]).float()
            logits[0] -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
            ids.append(int(logits[0].argmax()))
    return ids[len(prompt) :]


def test_greedy_with_penalties_matches_transformers_in_a_mixed_batch(llama_gqa_dir: Path) -> None:
    # Chunked prefill (a 64-token budget) so penalised rows share steps with others' prompts.
    llm = LLM(llama_gqa_dir, max_num_batched_tokens=64, max_num_seqs=8)
    settings = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=1.8),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, frequency_penalty=1.5),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, presence_penalty=2.0),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    prompts = mixed_prompts(len(settings), vocab=512, seed=5, lengths=[3, 90, 20, 150])
    outputs = llm.generate(prompts, settings)
    for prompt, params, out in zip(prompts, settings, outputs, strict=True):
        assert out.token_ids == _hf_penalised(llama_gqa_dir, prompt, params, 12), params
    assert llm.engine.runner.sampler.controls._slots == {}  # every finished request gave its row back
