"""Tokenizers trained from text, and the check that a pair task's tokenizer marks sentence B."""

import pytest
import torch
from edgedistill.common.recipe import RecipeError
from edgedistill.distill.tokenization import encode, load_tokenizer, require_segments, train_tokenizer
from transformers import GPT2ForSequenceClassification

from tests.distill.gpt_init import write_gpt2

TEXTS = ["a fine film about a dog", "the dog was dull", "fine acting and a dull plot"] * 20


def test_a_trained_bert_tokenizer_marks_sentence_b():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    # [CLS] a dog [SEP] dull [SEP]
    assert encode(tokenizer, ["a dog"], ["dull"], 16)["token_type_ids"] == [[0, 0, 0, 0, 1, 1]]


def test_a_bert_tokenizer_is_accepted_for_pairs():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    assert tokenizer("a", "b")["token_type_ids"] == [0, 0, 0, 1, 1]  # [CLS] a [SEP] b [SEP]: the pair it probes
    require_segments(tokenizer, "bert")  # a refusal raises RecipeError


def test_a_tokenizer_that_does_not_mark_sentence_b_is_refused_for_pairs():
    with pytest.raises(RecipeError, match="does not mark sentence B"):
        require_segments(train_tokenizer("gpt", TEXTS, 300), "gpt")


def test_a_checkpoint_that_is_not_there_is_named_with_the_setting(tmp_path):
    with pytest.raises(RecipeError, match=r"minilm: cannot load a tokenizer from it .*EDGEDISTILL_TEACHER_INIT"):
        load_tokenizer(str(tmp_path / "minilm"))


def left_padded_gpt2(tmp_path):
    return write_gpt2(tmp_path / "gpt2", TEXTS, padding_side="left")


def test_a_checkpoint_tokenizer_that_pads_on_the_left_is_loaded_padding_on_the_right(tmp_path):
    assert load_tokenizer(str(left_padded_gpt2(tmp_path))).padding_side == "right"


def test_a_gpt_teacher_gives_a_text_the_same_logits_alone_and_in_a_batch(tmp_path):
    folder = left_padded_gpt2(tmp_path)
    tokenizer = load_tokenizer(str(folder))
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification.from_pretrained(folder, pad_token_id=tokenizer.pad_token_id).eval()
    texts = ["a fine film about a dog and fine acting", "dull"]
    with torch.no_grad():
        batched = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits[1]
        alone = model(**tokenizer(texts[1:], return_tensors="pt")).logits[0]
    torch.testing.assert_close(batched, alone)


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_training_a_tokenizer_writes_nothing_into_a_log(capfd, family):
    train_tokenizer(family, TEXTS, 300)
    assert capfd.readouterr().out == ""
