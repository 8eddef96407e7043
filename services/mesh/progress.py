"""Progress bars for the demo: one tqdm bar per workload class, errors counted in its postfix."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from types import TracebackType

from tqdm import tqdm

from services.mesh.driver import RequestResult
from services.mesh.report import CLASSES, class_name
from services.mesh.workload import PlannedRequest


class ClassProgress:
    """`with ClassProgress(plan, enabled) as p:` then p.update(result) per finished request."""

    def __init__(self, plan: Sequence[PlannedRequest], enabled: bool = True) -> None:
        totals = Counter(p.workload_class for p in plan)
        width = max(len(class_name(c)) for c in CLASSES)
        self._bars = {
            c: tqdm(
                total=totals[c],
                desc=class_name(c).ljust(width),
                position=i,
                unit="req",
                leave=True,
                disable=not enabled,
                dynamic_ncols=True,
            )
            for i, c in enumerate(CLASSES)
        }
        self._errors: Counter[str] = Counter()

    def update(self, result: RequestResult) -> None:
        bar = self._bars[result.workload_class]
        if not result.ok:
            self._errors[result.workload_class.name] += 1
            bar.set_postfix(errors=self._errors[result.workload_class.name], refresh=False)
        bar.update(1)

    def __enter__(self) -> ClassProgress:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None):
        for bar in self._bars.values():
            bar.close()
