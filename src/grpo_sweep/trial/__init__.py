"""One trial: the parent (parent.py) starts a child process (worker.py) that builds the model
(models.py, tokenizer.py), the task (tasks/) and the trainer (backends/), runs real GRPO steps under
measurement (measure/) and writes metrics.json. Everything here may import torch, but only in the
child: the parent imports none of it."""
