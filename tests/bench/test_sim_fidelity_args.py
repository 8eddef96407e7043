"""bench/sim_fidelity.py refuses a window, a load or a repeat count it cannot serve, or one it would ignore,
before starting anything."""

from __future__ import annotations

import pytest

from bench.sim_fidelity import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "--repeats must be at least 1, got 0"),
        (["--seconds", "-5"], "--seconds must be positive"),
        (["--resimulate", "--repeats", "3"], "--resimulate reuses the last run's trace, load and repeats"),
        (["--resimulate", "--seconds", "600"], "--resimulate reuses the last run's trace, load and repeats"),
        (["--load-scale", "0"], "--load-scale must be positive, got 0.0"),
        (["--resimulate", "--load-scale", "0.5"], "drop --seconds, --offered-load, --load-scale"),
        (["--resimulate", "--offered-load", "0.5"], "--resimulate reuses the last run's trace, load"),
        (["--offered-load", "-1"], "--offered-load must be positive, got -1.0"),
        (["--offered-load", "0.5", "--load-scale", "2"], "give --offered-load or --load-scale, not both"),
    ],
)
def test_a_bad_window_or_repeat_count_is_refused_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
