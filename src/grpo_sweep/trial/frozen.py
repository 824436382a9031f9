"""Imported last by the forkserver (trial.parent.PRELOAD): freeze what the preload built.

After torch, transformers, TRL and the worker are imported the heap holds ~480,000 objects that live
as long as the process. Every full garbage collection walks them all: 0.28 s each on a 2-core
machine, and TRL/accelerate collect at least once per trial (accelerate's free_memory). gc.freeze()
moves them to the permanent generation, which the collector skips, so each forked trial starts
with nothing old to walk (~0.3 s less per tiny CPU trial), and the collector no longer writes to
the shared pages a fork would otherwise copy. Nothing preloaded is ever freed anyway.
"""

from __future__ import annotations

import gc

gc.freeze()
