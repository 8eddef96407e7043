"""vLLM as a contender: each run starts `bench/vllm_runner.py` under another interpreter (vLLM's own venv)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.workload import RunResult, Workload

RUNNER = Path(__file__).with_name("vllm_runner.py")


class VllmSubprocess:
    """Only the runner's `generate` call is timed; interpreter start, model load and warm-up are not."""

    def __init__(self, python: Path, model_dir: Path, scratch_dir: Path, timeout_s: float = 1800.0) -> None:
        self._python = python
        self._model_dir = model_dir
        self._scratch_dir = scratch_dir
        self._timeout_s = timeout_s

    def run(self, workload: Workload) -> RunResult:
        """Raises RuntimeError when the runner fails or prints no JSON line; its stderr goes to ours."""
        spec_path = self._scratch_dir / f"workload-{workload.spec.name}.json"
        spec_path.write_text(json.dumps({"prompts": workload.prompts, "output_lens": workload.output_lens}))
        proc = subprocess.run(
            [str(self._python), str(RUNNER), "--model", str(self._model_dir), "--workload", str(spec_path)],
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            text=True,
            timeout=self._timeout_s,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"vllm_runner exited {proc.returncode} without a result")
        report = json.loads(lines[-1])
        return RunResult(
            wall_s=float(report["wall_s"]),
            output_tokens=int(report["output_tokens"]),
            length_mismatches=int(report["length_mismatches"]),
            token_ids=report["token_ids"],
        )
