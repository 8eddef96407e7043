"""The fleet simulator (docs/simulator.md). COMPILED: whether its hot modules run compiled
(sim/compiled.py)."""

from sim.compiled import activate

COMPILED = activate(__path__)
