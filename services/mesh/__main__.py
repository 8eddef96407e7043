"""`python -m services.mesh`: the same as the `hanzo-mesh` command."""

from __future__ import annotations

import sys

from services.mesh.cli import main

if __name__ == "__main__":
    sys.exit(main())
