"""Columnar in-memory snapshot of the cluster: one row per worker node, one numpy column per field.

Pick reads it synchronously (no awaits), so one decision always sees one consistent state. Every write
is logged by row, so a reader that keeps per-row results (the Picker's rankings) rescores only the rows
written since it last looked, not the whole fleet. Rows of nodes that left are recycled; `live` marks
rows in use.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from services.placer.cluster.batches import Column, LoadBatch, ThermalBatch
from services.placer.cluster.records import NodeRecord, ThermalSample
from services.placer.cluster.reserve import reserve_rank


class NodeLoadLike(Protocol):
    """A heartbeat's load: placer_pb2.NodeLoad, or a NodeRecord (which carries the same fields)."""

    running: int
    waiting: int
    max_running: int
    batch_running: int
    batch_waiting: int
    latency_prompt_tokens: int
    kv_usage: float


_FLOAT_COLUMNS = (
    "deadline_s",
    "running",
    "waiting",
    "max_running",
    "batch_running",
    "batch_waiting",
    "latency_prompt_tokens",
    "kv_usage",
    "memory_total_bytes",
    "memory_free_bytes",
    "temperature_c",
    "slowdown_temperature_c",
    "shutdown_temperature_c",
    "temperature_trend_c_per_s",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "utilization",
    "thermal_timestamp_s",
    "reserve_rank",
)
_BOOL_COLUMNS = ("live", "draining", "has_thermal", "thermal_simulated")
_CODE_COLUMNS = ("zone", "rack", "host")  # interned label codes; UNKNOWN_CODE where empty


UNKNOWN_CODE = -1

# Shared by every snapshot, so an epoch number never means two snapshots (readers key on it).
_EPOCHS = itertools.count()
# The write log keeps at least this many entries (and twice the capacity) before dropping its older half.
_MIN_LOG_ENTRIES = 4096


def topology_keys(zone: str, rack: str, host: str) -> tuple[str, str, str]:
    """Labels as compared: a rack is qualified by its zone (rack "r1" in two zones is two racks); host
    names are taken as unique across the cluster, as hostnames are. "" stays unknown."""
    return zone, f"{zone}/{rack}" if rack else "", host


@dataclass
class ModelColumns:
    """Per-model residency: resident[i] / host_copy[i] for row i, and the model's weight size; listed[i]:
    node i reported the model at all (resident, a host copy, or in its catalog to load from disk), so it
    can load it. A node may only be asked to load what it lists: a worker loads from its own catalog."""

    resident: np.ndarray
    host_copy: np.ndarray
    weight_bytes: int
    listed: np.ndarray


class ClusterSnapshot:
    """Columns sized to `capacity` rows; only rows with live[i] are nodes."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        # Changes when every row must be read again (columns reallocated, a model's size changed, the
        # write log dropped entries a reader may not have seen); unique across snapshots.
        self.epoch = next(_EPOCHS)
        self._log: list[int] = []  # rows written, oldest first (a row appears once per write)
        self._log_start = 0  # position of _log[0] among every write since the epoch began
        self.num_rows = 0  # rows ever used; columns are valid in [:num_rows]
        self.node_ids: list[str | None] = []
        self.addresses: list[str] = []
        self.row_of: dict[str, int] = {}
        # Counts the times a node id got or lost a row: a reader that keeps rows by node id looks them up
        # again when it changes (the simulator's llm-d prefix index).
        self.membership = 0
        self._free_rows: list[int] = []
        self._codes: dict[str, int] = {}  # label string -> code, shared by zone / rack / host
        self._labelled: dict[tuple[str, int], np.ndarray] = {}  # (column, code) -> rows; see labelled
        # Bumped whenever a label is interned or a row's label changes, so readers may cache what
        # known_code and labelled returned for a caller until it moves.
        self.label_epoch = 0
        self.models: dict[str, ModelColumns] = {}
        self.clock_event_reasons = np.zeros(capacity, dtype=np.uint64)
        for name in _FLOAT_COLUMNS:
            setattr(self, name, np.zeros(capacity, dtype=np.float64))
        for name in _BOOL_COLUMNS:
            setattr(self, name, np.zeros(capacity, dtype=bool))
        for name in _CODE_COLUMNS:
            setattr(self, name, np.full(capacity, UNKNOWN_CODE, dtype=np.int32))

    # Typed views of the dynamically created columns, for readers and type checkers.
    deadline_s: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    max_running: np.ndarray
    batch_running: np.ndarray
    batch_waiting: np.ndarray
    latency_prompt_tokens: np.ndarray
    kv_usage: np.ndarray
    memory_total_bytes: np.ndarray
    memory_free_bytes: np.ndarray
    temperature_c: np.ndarray
    slowdown_temperature_c: np.ndarray
    shutdown_temperature_c: np.ndarray
    temperature_trend_c_per_s: np.ndarray
    power_w: np.ndarray
    power_limit_w: np.ndarray
    sm_clock_mhz: np.ndarray
    sm_clock_max_mhz: np.ndarray
    utilization: np.ndarray
    thermal_timestamp_s: np.ndarray
    reserve_rank: np.ndarray
    live: np.ndarray
    draining: np.ndarray
    has_thermal: np.ndarray
    thermal_simulated: np.ndarray
    zone: np.ndarray
    rack: np.ndarray
    host: np.ndarray

    def __len__(self) -> int:
        return len(self.row_of)

    def code(self, label: str) -> int:
        """Interned code of a topology label; UNKNOWN_CODE for "" (never equal to any node's label)."""
        if not label:
            return UNKNOWN_CODE
        code = self._codes.get(label)
        if code is None:
            code = self._codes[label] = len(self._codes)
            self.label_epoch += 1
        return code

    def known_code(self, label: str) -> int:
        """Code of a label some node carries; UNKNOWN_CODE otherwise. Never stores: callers' labels
        (one per request) must not grow the table."""
        return self._codes.get(label, UNKNOWN_CODE) if label else UNKNOWN_CODE

    def labelled(self, column: str, code: int) -> np.ndarray:
        """Rows whose topology column ("zone", "rack" or "host") holds code, rows no longer live
        included (readers rank those out anyway); cached until some row's label changes."""
        key = (column, code)
        rows = self._labelled.get(key)
        if rows is None:
            rows = self._labelled[key] = np.flatnonzero(self.column(column) == code)
        return rows

    @property
    def write_position(self) -> int:
        """How many writes this epoch has seen: a reader's mark for written_since."""
        return self._log_start + len(self._log)

    def written_since(self, position: int) -> list[int] | None:
        """Rows written at or after position (a write_position of this epoch; repeats possible); None if
        the log no longer reaches back that far, and the reader must read every row."""
        if position < self._log_start:
            return None
        return self._log[position - self._log_start :]

    def _written(self, row: int) -> None:
        self._log.append(row)
        self._trim_log()

    def _written_rows(self, rows: np.ndarray) -> None:
        self._log.extend(rows.tolist())
        self._trim_log()

    def _trim_log(self) -> None:
        log = self._log
        if len(log) > max(_MIN_LOG_ENTRIES, 2 * self.capacity):
            half = len(log) // 2
            del log[:half]
            self._log_start += half

    def _every_row_changed(self) -> None:
        self.epoch = next(_EPOCHS)
        self._log.clear()
        self._log_start = 0

    def column(self, name: str) -> np.ndarray:
        """The first num_rows entries of a column (a view, not a copy)."""
        return getattr(self, name)[: self.num_rows]

    def model_columns(self, model: str) -> ModelColumns | None:
        """Residency columns of model (views over num_rows); None if no node ever reported it."""
        columns = self.models.get(model)
        if columns is None:
            return None
        n = self.num_rows
        return ModelColumns(
            columns.resident[:n], columns.host_copy[:n], columns.weight_bytes, columns.listed[:n]
        )

    def upsert(self, record: NodeRecord) -> int:
        """Write record into its row (a new row for a new node); returns the row."""
        row = self.row_of.get(record.node_id)
        if row is None:
            row = self._new_row(record.node_id)
        self._written(row)
        self.addresses[row] = record.address
        self.live[row] = True
        self.draining[row] = record.draining
        self.memory_total_bytes[row] = record.memory_total_bytes
        self._write_load(row, record, record.memory_free_bytes, record.deadline_s)
        codes = [self.code(label) for label in topology_keys(record.zone, record.rack, record.host)]
        for name, code in zip(_CODE_COLUMNS, codes, strict=True):
            column = getattr(self, name)
            if column[row] != code:
                column[row] = code
                self._labelled.clear()
                self.label_epoch += 1
        reported = set()
        for model in record.models:
            columns = self._model(model.name, model.weight_bytes)
            columns.resident[row] = model.resident
            columns.host_copy[row] = model.host_copy
            columns.listed[row] = True
            reported.add(model.name)
        for name, columns in self.models.items():
            if name not in reported:
                columns.resident[row] = False
                columns.host_copy[row] = False
                columns.listed[row] = False
        self._write_thermal(row, record.thermal, record.temperature_trend_c_per_s)
        return row

    def update_load(
        self, node_id: str, load: NodeLoadLike, memory_free_bytes: int, deadline_s: float
    ) -> None:
        """Write only the load of a known node (a heartbeat that changed nothing else; a node not in the
        snapshot is a caller's bug: KeyError)."""
        row = self.row_of[node_id]
        self._written(row)
        self._write_load(row, load, memory_free_bytes, deadline_s)

    def update_loads(self, batch: LoadBatch) -> None:
        """update_load for many known nodes at once (their rows in batch.rows)."""
        self._written_rows(batch.rows)
        self._write_load(batch.rows, batch, batch.memory_free_bytes, batch.deadline_s)  # type: ignore[arg-type]

    def _write_load(
        self, row: int | np.ndarray, load: NodeLoadLike, memory_free_bytes: Column, deadline_s: Column
    ) -> None:
        """Writes one row, or every row of an array of rows from columns (LoadBatch)."""
        self.deadline_s[row] = deadline_s
        self.running[row] = load.running
        self.waiting[row] = load.waiting
        self.max_running[row] = load.max_running
        self.batch_running[row] = load.batch_running
        self.batch_waiting[row] = load.batch_waiting
        self.latency_prompt_tokens[row] = load.latency_prompt_tokens
        self.kv_usage[row] = load.kv_usage
        self.memory_free_bytes[row] = memory_free_bytes

    def add_waiting(self, row: int, batch: bool = False, latency_tokens: int = 0) -> None:
        """Count one more request waiting at row (a BATCH one if batch), and latency_tokens more prompt
        tokens of the latency classes to compute there, until its next heartbeat reports the real
        figures."""
        self._written(row)
        self.waiting[row] += 1
        self.latency_prompt_tokens[row] += latency_tokens
        if batch:
            self.batch_waiting[row] += 1

    def remove(self, node_id: str) -> None:
        """Forget a node; its row is recycled. No-op for an unknown node."""
        row = self.row_of.pop(node_id, None)
        if row is None:
            return
        self.membership += 1
        self._written(row)
        self.live[row] = False
        self.has_thermal[row] = False
        self.node_ids[row] = None
        for columns in self.models.values():
            columns.resident[row] = False
            columns.host_copy[row] = False
            columns.listed[row] = False
        self._free_rows.append(row)

    def update_thermal(self, node_id: str, sample: ThermalSample | None, trend_c_per_s: float) -> bool:
        """Write only the thermal columns of a known node (telemetry arrives far more often than
        heartbeats; None: its sample expired, the state is unknown); False if the node is unknown."""
        row = self.row_of.get(node_id)
        if row is None:
            return False
        self._written(row)
        self._write_thermal(row, sample, trend_c_per_s)
        return True

    def update_thermals(self, batch: ThermalBatch, trend_c_per_s: np.ndarray) -> None:
        """update_thermal for many known nodes at once (their rows in batch.rows)."""
        self._written_rows(batch.rows)
        self._write_thermal(batch.rows, batch, trend_c_per_s)  # type: ignore[arg-type]

    def _write_thermal(
        self, row: int | np.ndarray, sample: ThermalSample | None, trend_c_per_s: Column
    ) -> None:
        """Writes one row, or every row of an array of rows from columns (ThermalBatch)."""
        self.has_thermal[row] = sample is not None
        if sample is None:
            return
        self.thermal_simulated[row] = sample.simulated
        self.thermal_timestamp_s[row] = sample.timestamp_s
        self.temperature_c[row] = sample.temperature_c
        self.slowdown_temperature_c[row] = sample.slowdown_temperature_c
        self.shutdown_temperature_c[row] = sample.shutdown_temperature_c
        self.temperature_trend_c_per_s[row] = trend_c_per_s
        self.clock_event_reasons[row] = sample.clock_event_reasons
        self.power_w[row] = sample.power_w
        self.power_limit_w[row] = sample.power_limit_w
        self.sm_clock_mhz[row] = sample.sm_clock_mhz
        self.sm_clock_max_mhz[row] = sample.sm_clock_max_mhz
        self.utilization[row] = sample.utilization

    def _new_row(self, node_id: str) -> int:
        if self._free_rows:
            row = self._free_rows.pop()
            self.node_ids[row] = node_id
        else:
            if self.num_rows == self.capacity:
                self._grow()
            row = self.num_rows
            self.num_rows += 1
            self.node_ids.append(node_id)
            self.addresses.append("")
        self.row_of[node_id] = row
        self.reserve_rank[row] = reserve_rank(node_id)
        self.membership += 1
        return row

    def _model(self, name: str, weight_bytes: int) -> ModelColumns:
        columns = self.models.get(name)
        if columns is None:
            columns = ModelColumns(
                np.zeros(self.capacity, dtype=bool),
                np.zeros(self.capacity, dtype=bool),
                weight_bytes,
                np.zeros(self.capacity, dtype=bool),
            )
            self.models[name] = columns
            self._every_row_changed()  # every row may now be able to load it
        elif weight_bytes and weight_bytes != columns.weight_bytes:
            columns.weight_bytes = weight_bytes
            self._every_row_changed()  # whether the model fits changes on every row
        return columns

    def _grow(self) -> None:
        """Double every column (amortised O(1) per new node)."""
        old = self.capacity
        self.capacity *= 2
        self._every_row_changed()  # readers' per-row arrays are sized to the old capacity
        for name in (*_FLOAT_COLUMNS, *_BOOL_COLUMNS, *_CODE_COLUMNS, "clock_event_reasons"):
            column = getattr(self, name)
            grown = (
                np.full(self.capacity, UNKNOWN_CODE, dtype=column.dtype)
                if name in _CODE_COLUMNS
                else (np.zeros(self.capacity, dtype=column.dtype))
            )
            grown[:old] = column
            setattr(self, name, grown)
        for columns in self.models.values():
            for attr in ("resident", "host_copy", "listed"):
                grown = np.zeros(self.capacity, dtype=bool)
                grown[:old] = getattr(columns, attr)
                setattr(columns, attr, grown)
