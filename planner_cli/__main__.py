"""`python -m planner_cli`: the `planner` command."""

import sys

from planner_cli.main import main

sys.exit(main())
