"""Scheduling policy of the decoder engine: which waiting request goes next, how big a step may be.

No torch here. The scheduler asks the policy; the policy never touches blocks or tensors. Import
the submodules directly (classes, waiting, tenants, budget, policy): sequence.py imports classes.
"""
