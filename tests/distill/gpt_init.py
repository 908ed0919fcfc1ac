"""A tiny GPT-2 checkpoint folder, as `model.init` names one: a byte-level BPE tokenizer without a pad token, as
GPT-2's is, and a causal LM of two layers."""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

from tests.conftest import save_initialised

EOS = "<|endoftext|>"


def write_gpt2(folder: Path, texts: list[str], positions: int = 256, padding_side: str = "right") -> Path:
    """Save the checkpoint into `folder`, its tokenizer trained on `texts`; `positions` sizes its position
    embeddings, `padding_side` is what its tokenizer config says (generation checkpoints often say left)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS], initial_alphabet=alphabet))
    tokenizer = GPT2TokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS, padding_side=padding_side
    )
    tokenizer.save_pretrained(folder)
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_positions=positions,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    save_initialised(GPT2LMHeadModel, config, folder)
    return folder
