"""Run one real GRPO trial (or many with -m): `python train.py [overrides]`.

The same entry point as `python -m grpo_sweep` (grpo_sweep/cli/train.py); the configs are the
package's (conf/ here is a link to src/grpo_sweep/conf/).
"""

from grpo_sweep.cli.train import main

if __name__ == "__main__":
    main()
