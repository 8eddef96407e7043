"""Runs the benchmark workload through vLLM's offline API; executed by the interpreter of a vLLM virtualenv.

Self-contained (stdlib + vllm) because that interpreter cannot import this repo's dependencies. Usage:
    python bench/vllm_runner.py --model DIR --workload W.json [--max-num-seqs N]
W.json: {"prompts": [[ids...], ...], "output_lens": [n, ...]}. Prints one JSON line: vllm_tok_s, wall_s, ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# A tiny untimed generate, so first-call costs (compile, allocator growth) stay out of the timing.
WARMUP_PROMPT_LEN = 32
WARMUP_OUTPUT_LEN = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--workload", required=True, type=Path)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--memory-utilization", type=float, default=0.4, help="vLLM gpu_memory_utilization")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    spec = json.loads(args.workload.read_text())
    prompts: list[list[int]] = spec["prompts"]
    output_lens: list[int] = spec["output_lens"]

    extra = {} if args.max_num_seqs is None else {"max_num_seqs": args.max_num_seqs}
    # skip_tokenizer_init: the synthetic checkpoint may ship no tokenizer, and we only need token ids.
    llm = LLM(
        model=str(args.model),
        dtype=args.dtype,
        skip_tokenizer_init=True,
        max_model_len=args.max_model_len,
        seed=0,
        # On the CPU backend this is the share of host memory vLLM reserves (KV cache included); its 0.92
        # default fails on a machine that runs anything else.
        gpu_memory_utilization=args.memory_utilization,
        **extra,
    )

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)

    # A TokensPrompt is a TypedDict, so a plain dict with prompt_token_ids is accepted by every vLLM version.
    warm = [{"prompt_token_ids": list(range(3, 3 + WARMUP_PROMPT_LEN))}]
    llm.generate(warm, [params(WARMUP_OUTPUT_LEN)], use_tqdm=False)

    requests = [{"prompt_token_ids": p} for p in prompts]
    start = time.perf_counter()
    outs = llm.generate(requests, [params(n) for n in output_lens], use_tqdm=False)
    wall = time.perf_counter() - start

    generated = [list(o.outputs[0].token_ids) for o in outs]
    mismatches = sum(len(g) != n for g, n in zip(generated, output_lens, strict=True))
    print(f"vllm_runner: {len(outs)} requests in {wall:.2f}s", file=sys.stderr)
    print(
        json.dumps(
            {
                "vllm_tok_s": sum(output_lens) / wall,
                "wall_s": wall,
                "output_tokens": sum(output_lens),
                "length_mismatches": mismatches,
                "token_ids": generated,
            }
        )
    )


if __name__ == "__main__":
    main()
