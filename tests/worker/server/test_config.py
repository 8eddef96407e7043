"""WorkerSettings' scheduling-policy variables: the class-policy JSON merged over the defaults, and every
malformed value refused with a ValueError that names the variable and the bad key."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.workload import WorkloadClass
from services.worker.engine.policy.classes import DEFAULT_CLASS_POLICIES, PolicyName
from services.worker.server.config import (
    MAX_CPU_ARENA_BYTES,
    MIN_CPU_ARENA_BYTES,
    WorkerSettings,
    parse_class_policies,
)

VAR = "HANZO_WORKER_CLASS_POLICIES"
BATCH = DEFAULT_CLASS_POLICIES[WorkloadClass.BATCH]
CHAT = DEFAULT_CLASS_POLICIES[WorkloadClass.REALTIME_CHAT]


@pytest.mark.parametrize(
    ("raw", "changed"),
    [
        ("", {}),
        ("{}", {}),
        (
            '{"BATCH": {"max_waiting": 2, "queue_timeout_s": 1.5}, "REALTIME_CHAT": {"ttft_slo_s": 0.5}}',
            {
                WorkloadClass.BATCH: dataclasses.replace(BATCH, max_waiting=2, queue_timeout_s=1.5),
                WorkloadClass.REALTIME_CHAT: dataclasses.replace(CHAT, ttft_slo_s=0.5),
            },
        ),
        ('{"batch": {"queue_timeout_s": null, "max_waiting": null}}',  # lower case; null clears a limit
         {WorkloadClass.BATCH: dataclasses.replace(BATCH, queue_timeout_s=None, max_waiting=None)}),
        ('{"AGENT_TOOL": {"priority": 0, "itl_slo_s": 1}}',  # an int where a float is wanted is fine
         {WorkloadClass.AGENT_TOOL: dataclasses.replace(
             DEFAULT_CLASS_POLICIES[WorkloadClass.AGENT_TOOL], priority=0, itl_slo_s=1.0)}),
    ],
)  # fmt: skip
def test_class_policies_merge_field_by_field_over_the_defaults(raw: str, changed: dict) -> None:
    assert dict(parse_class_policies(raw, VAR)) == {**DEFAULT_CLASS_POLICIES, **changed}


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ("not json", ["not a JSON object"]),
        ("[1, 2]", ["expected a JSON object"]),
        ('{"BULK": {"max_waiting": 1}}', ["'BULK'", "known: UNSPECIFIED"]),
        ('{"BATCH": {"max_wait": 1}}', ["BATCH", "'max_wait'", "known: priority"]),
        ('{"BATCH": 3}', ["BATCH", "object of fields"]),
        ('{"BATCH": {"max_waiting": -1}}', ["BATCH", "max_waiting"]),
        ('{"BATCH": {"max_waiting": 1.5}}', ["BATCH.max_waiting", "an integer"]),
        ('{"BATCH": {"max_waiting": true}}', ["BATCH.max_waiting"]),
        ('{"BATCH": {"queue_timeout_s": "soon"}}', ["BATCH.queue_timeout_s", "a number"]),
        ('{"BATCH": {"queue_timeout_s": 0}}', ["BATCH", "queue_timeout_s"]),
        ('{"BATCH": {"queue_timeout_s": NaN}}', ["NaN"]),
        ('{"BATCH": {"priority": null}}', ["BATCH.priority"]),
        ('{"BATCH": {}, "BATCH": {}}', ["'BATCH'", "twice"]),
        ('{"BATCH": {}, "batch": {}}', ["'batch'", "twice"]),
    ],
)
def test_bad_class_policies_name_the_variable_and_the_key(raw: str, names: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        WorkerSettings.from_env({VAR: raw})
    for name in [VAR, *names]:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("environ", "policy", "reserve"),
    [
        ({}, PolicyName.ADAPTIVE, 0.1),
        ({"HANZO_WORKER_SCHEDULING_POLICY": "fifo"}, PolicyName.FIFO, 0.1),
        ({"HANZO_WORKER_SCHEDULING_POLICY": " Adaptive "}, PolicyName.ADAPTIVE, 0.1),
        ({"HANZO_WORKER_LATENCY_RESERVE": "0"}, PolicyName.ADAPTIVE, 0.0),
        ({"HANZO_WORKER_LATENCY_RESERVE": "0.25"}, PolicyName.ADAPTIVE, 0.25),
    ],
)
def test_policy_config_is_built_from_the_variables(environ: dict, policy: PolicyName, reserve: float) -> None:
    environ = {**environ, VAR: '{"BATCH": {"max_waiting": 2}}'}
    config = WorkerSettings.from_env(environ).policy_config()
    assert config.name is policy and config.latency_reserve == reserve
    assert config.itl_min_efficiency == 0.9
    assert config.classes[WorkloadClass.BATCH].max_waiting == 2
    assert config.classes[WorkloadClass.REALTIME_CHAT] == CHAT


@pytest.mark.parametrize(
    ("name", "raw", "words"),
    [
        ("HANZO_WORKER_SCHEDULING_POLICY", "lottery", "use adaptive|fifo"),
        ("HANZO_WORKER_LATENCY_RESERVE", "1", "must be < 1"),
        ("HANZO_WORKER_LATENCY_RESERVE", "-0.1", "must be >= 0"),
        ("HANZO_WORKER_LATENCY_RESERVE", "lots", "is not a number"),
        ("HANZO_WORKER_ITL_MIN_EFFICIENCY", "1.5", "must be <= 1"),
        ("HANZO_WORKER_ITL_MIN_EFFICIENCY", "-1", "must be >= 0"),
    ],
)
def test_bad_policy_variables_name_the_variable(name: str, raw: str, words: str) -> None:
    with pytest.raises(ValueError) as err:
        WorkerSettings.from_env({name: raw})
    assert name in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("raw", ["0", "1", "0.5"])
def test_itl_min_efficiency_variable_reaches_the_policy(raw: str) -> None:
    config = WorkerSettings.from_env({"HANZO_WORKER_ITL_MIN_EFFICIENCY": raw}).policy_config()
    assert config.itl_min_efficiency == float(raw)


def test_settings_built_in_code_are_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="latency_reserve"):
        WorkerSettings(latency_reserve=1.5)


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"HANZO_WORKER_ARENA_BYTES": "-1"}, "HANZO_WORKER_ARENA_BYTES='-1' must be >= 0"),
        ({"HANZO_WORKER_ARENA_BYTES": "lots"}, "HANZO_WORKER_ARENA_BYTES='lots' is not an integer"),
        ({"HANZO_WORKER_ARENA_FRACTION": "1.5"}, "HANZO_WORKER_ARENA_FRACTION=1.5 must be in (0, 1]"),
        ({"HANZO_WORKER_ARENA_BYTES": "1024", "HANZO_WORKER_ARENA_FRACTION": "0.5"}, "not both"),
        ({"HANZO_WORKER_HOST_COPY_BYTES": "-5"}, "HANZO_WORKER_HOST_COPY_BYTES='-5' must be >= 0"),
        ({"HANZO_WORKER_EVICT_BUSY": "maybe"}, "HANZO_WORKER_EVICT_BUSY='maybe': use one of"),
        ({"HANZO_WORKER_KV_DONOR_MIN_BLOCKS": "0"}, "HANZO_WORKER_KV_DONOR_MIN_BLOCKS='0' must be >= 1"),
    ],
)
def test_bad_memory_variables_name_the_variable(environ: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError) as err:
        WorkerSettings.from_env(environ)
    assert words in str(err.value)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"HANZO_WORKER_DEVICE": "cuda"}, (0.9, None)),  # CUDA default: a fraction of free memory
        ({"HANZO_WORKER_ARENA_BYTES": "0"}, (None, None)),  # no arena
        ({"HANZO_WORKER_ARENA_FRACTION": "0.5", "HANZO_WORKER_DEVICE": "cuda"}, (0.5, None)),
    ],
)
def test_arena_size_defaults_per_device(environ: dict[str, str], expected: tuple[object, object]) -> None:
    assert WorkerSettings.from_env(environ).arena_size() == expected


def test_cpu_arena_default_is_a_share_of_available_memory_within_bounds() -> None:
    fraction, byte_budget = WorkerSettings.from_env({}).arena_size()
    assert fraction is None and byte_budget is not None
    assert MIN_CPU_ARENA_BYTES <= byte_budget <= MAX_CPU_ARENA_BYTES
