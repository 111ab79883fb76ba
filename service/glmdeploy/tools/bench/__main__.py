"""`python -m glmdeploy.tools.bench`: the benchmark's command line."""

import sys

from glmdeploy.tools.bench.cli import main

sys.exit(main())
