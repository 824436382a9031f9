"""Hydra configs shipped with grpo-sweep (a package so Hydra can find them as pkg://grpo_sweep.conf)."""
