"""`python -m grpo_sweep.cli <command>`: the same as the `grpo-sweep` command."""

import sys

from grpo_sweep.cli import main

sys.exit(main())
