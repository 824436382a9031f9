"""`python -m grpo_sweep [overrides]`: the same as the repository's train.py, from any directory."""

from grpo_sweep.cli.train import main

if __name__ == "__main__":
    main()
