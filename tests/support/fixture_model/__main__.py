"""`python -m fixture_model DEST [--shape ...]`: write the fixture model (see the package's docstring)."""

from __future__ import annotations

import sys

from fixture_model import main

sys.exit(main())
