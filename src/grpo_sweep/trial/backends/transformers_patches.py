"""Every patch grpo-sweep applies to transformers, each in the trial process only and on one model.

Each patch names the upstream version it targets and the condition for its removal.
tests/test_backends.py reads each target as the patch reads it, so an upgrade that moves one fails
there, in seconds.
"""

from __future__ import annotations

# The gradient_checkpointing_kwargs keys transformers' Trainer takes out before the rest reach torch's
# checkpoint (transformers 5.17 trainer.py: "`every_n_layers` selects which layers ... `offload` where").
LAYER_SELECTION_KEYS = ("every_n_layers", "offload")


def keep_checkpointing_settings(trainer) -> None:
    """TRL 1.16 turns checkpointing off around each generation and back on with
    `gradient_checkpointing_enable(args.gradient_checkpointing_kwargs)`, the whole dict
    (trl/models/utils.py `disable_gradient_checkpointing`, `_unwrap_model_for_generation`): torch's checkpoint
    then refuses every_n_layers ("Unexpected keyword arguments: every_n_layers") and the re-enabled model would
    checkpoint every layer without offload. The base model's `gradient_checkpointing_enable` here takes those
    keys out of the dict and passes them as its own arguments, as transformers' Trainer does, so every call
    enables the checkpointing the trial asked for.

    Targets: transformers 5.17 `PreTrainedModel.gradient_checkpointing_enable(gradient_checkpointing_kwargs,
    every_n_layers, offload)`, as TRL 1.16 `disable_gradient_checkpointing` calls it. Remove once TRL
    re-enables checkpointing with the layer selection taken out of the dict, as the Trainer does."""
    if not set(trainer.args.gradient_checkpointing_kwargs or {}) & set(LAYER_SELECTION_KEYS):
        return
    model = trainer.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    enable = base.gradient_checkpointing_enable  # the bound method of transformers' PreTrainedModel

    def enable_with_layer_selection(gradient_checkpointing_kwargs=None, **kwargs):
        rest = dict(gradient_checkpointing_kwargs or {})
        for key in LAYER_SELECTION_KEYS:
            if key in rest:
                kwargs.setdefault(key, rest.pop(key))
        return enable(gradient_checkpointing_kwargs=rest or None, **kwargs)

    base.gradient_checkpointing_enable = enable_with_layer_selection
