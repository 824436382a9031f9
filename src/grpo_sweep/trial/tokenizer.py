"""A byte-level BPE tokenizer trained locally with `tokenizers`, so the default run needs no download.

It is trained on text the task generates, deterministically, in well under a second.
"""

from __future__ import annotations

from collections.abc import Iterable

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# A plain chat template for conversational prompts (task=dataset); tasks/dataset.py `render` writes the same.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_local_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Return a transformers `PreTrainedTokenizerFast` whose vocabulary fits `vocab_size`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    out.chat_template = CHAT_TEMPLATE
    return out
