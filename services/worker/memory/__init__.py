"""Memory manager: one arena reserved at start, carved into a weights slot + KV pool per resident model.

Import from the submodules (memory.manager, memory.placement, memory.errors, ...): no one name stands
for the package, so it re-exports none."""
