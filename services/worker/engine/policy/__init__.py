"""Scheduling policy of the decoder engine: which waiting request goes next, how big a step may be.

No torch here. The scheduler asks the policy; the policy never touches blocks or tensors. Import
the submodules directly (classes, waiting, tenants, budget, policy): the package re-exports nothing,
because a sequence carries the policy's hints (sequence.py imports classes) while the policy orders
sequences (policy.py imports sequence), and a package importing policy.py would close that loop.
"""
