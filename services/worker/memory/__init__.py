"""Memory manager: one arena reserved at start, carved into a weights slot + KV pool per resident model.

Import from the submodules (memory.manager, memory.placement, memory.errors, ...): the package itself
imports nothing, so a process that only maps memory errors to status codes does not load torch."""
