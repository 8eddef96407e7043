"""`hanzo-mesh`: the whole mesh as local processes on small models, plus a seeded mixed-workload demo."""
