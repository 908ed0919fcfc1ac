"""Tokenizers trained from text, and the check that a pair task's tokenizer marks sentence B."""

from pathlib import Path

import numpy as np
import pytest
import torch
from edgedistill.common.recipe import RecipeError
from edgedistill.common.settings import PROGRESS_INTERVAL_VAR, PROGRESS_VAR
from edgedistill.distill import tokenization
from edgedistill.distill.tokenization import BERT_SPECIALS, encode, load_tokenizer, pair_segments, train_tokenizer
from edgedistill.serve.encoding import TextEncoder
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoTokenizer,
    BertConfig,
    ByT5Tokenizer,
    GPT2ForSequenceClassification,
    PreTrainedTokenizerFast,
)

from tests.distill.gpt_init import write_gpt2
from tests.roberta_init import write_roberta

TEXTS = ["a fine film about a dog", "the dog was dull", "fine acting and a dull plot"] * 20


def test_a_trained_bert_tokenizer_marks_sentence_b():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    # [CLS] a dog [SEP] dull [SEP]
    assert list(encode(tokenizer, ["a dog"], ["dull"], 16)["token_type_ids"]) == [[0, 0, 0, 0, 1, 1]]


def test_a_bert_tokenizer_trained_again_on_the_same_texts_has_the_same_vocabulary():
    vocabularies = [train_tokenizer("bert", TEXTS, 60).get_vocab() for _ in range(6)]
    assert all(vocabulary == vocabularies[0] for vocabulary in vocabularies)


def test_a_trained_bert_tokenizers_word_pieces_are_not_special_tokens():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    ids = tokenizer("a dull plot", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a dull plot"


def saved_with_positions(tmp_path, family):
    """A tokenizer trained for a model of 8 positions, saved and read back as a checkpoint's (`AutoTokenizer`)."""
    train_tokenizer(family, TEXTS, 300, max_length=8).save_pretrained(tmp_path / family)
    return AutoTokenizer.from_pretrained(tmp_path / family)


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_a_saved_trained_tokenizer_keeps_its_models_positions_as_its_length(tmp_path, family):
    assert saved_with_positions(tmp_path, family).model_max_length == 8


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_a_saved_trained_tokenizer_truncates_a_long_text_to_its_models_positions(tmp_path, family):
    tokenizer = saved_with_positions(tmp_path, family)
    assert len(tokenizer(" ".join(TEXTS), truncation=True)["input_ids"]) == 8


def test_encode_holds_token_ids_as_int32():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    assert encode(tokenizer, TEXTS, None, 16)["input_ids"].values.dtype == np.int32


def test_encode_gives_each_text_its_tokenizer_ids():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    assert (
        list(encode(tokenizer, TEXTS[:5], None, 4)["input_ids"])
        == tokenizer(TEXTS[:5], truncation=True, max_length=4)["input_ids"]
    )


def test_encode_with_a_name_prints_its_progress_in_status_lines(monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_VAR, "lines")
    monkeypatch.setenv(PROGRESS_INTERVAL_VAR, "0.000001")
    encode(train_tokenizer("bert", TEXTS, 60), TEXTS * 50, None, 16, desc="tokenize")
    assert f"[tokenize] {len(TEXTS) * 50:,}/{len(TEXTS) * 50:,} text (100%)" in capsys.readouterr().err


class Counting:
    """A tokenizer that records how many texts each call gets."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sizes = tokenizer, []

    def __call__(self, texts, *args, **kwargs):
        self.sizes.append(len(texts))
        return self.tokenizer(texts, *args, **kwargs)


def test_encode_tokenizes_a_chunk_of_texts_at_a_time(monkeypatch):
    monkeypatch.setattr(tokenization, "ENCODE_CHUNK", 7)
    counting = Counting(train_tokenizer("bert", TEXTS, 60))
    encode(counting, TEXTS, None, 16)
    assert max(counting.sizes) == 7


def test_a_bert_tokenizer_s_pairs_are_split_by_its_token_types():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    assert tokenizer("a", "b")["token_type_ids"] == [0, 0, 0, 1, 1]  # [CLS] a [SEP] b [SEP]: the pair it probes
    assert pair_segments(tokenizer, "bert") == "token_types"


def test_a_bert_pair_s_student_segment_ids_are_its_tokenizer_s_token_type_ids():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    pairs = TEXTS[1:31]
    students = encode(tokenizer, TEXTS[:30], pairs, 16, student_segments=True)["token_type_ids"]
    assert list(students) == tokenizer(TEXTS[:30], pairs, truncation=True, max_length=16)["token_type_ids"]


def distilbert_style(bert: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """`bert`'s WordPiece and pair template without token type ids among its outputs, as DistilBERT's tokenizer."""
    return PreTrainedTokenizerFast(
        tokenizer_object=bert.backend_tokenizer, pad_token="[PAD]", model_input_names=["input_ids", "attention_mask"]
    )


def test_a_distilbert_style_tokenizer_s_pairs_are_split_by_its_sequence_ids():
    assert pair_segments(distilbert_style(train_tokenizer("bert", TEXTS, 60)), "distilbert") == "sequence_ids"


def test_a_distilbert_style_pair_is_split_where_bert_s_token_types_split_it():
    bert = train_tokenizer("bert", TEXTS, 60)
    made = encode(distilbert_style(bert), TEXTS[:30], TEXTS[1:31], 16, student_segments=True)["token_type_ids"]
    assert list(made) == list(encode(bert, TEXTS[:30], TEXTS[1:31], 16)["token_type_ids"])


def test_a_gpt_tokenizer_is_refused_for_pairs():
    with pytest.raises(RecipeError, match="does not mark sentence B of a pair .no token type 1, and no special token"):
        pair_segments(train_tokenizer("gpt", TEXTS, 300), "gpt")


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    return load_tokenizer(str(write_roberta(tmp_path_factory.mktemp("roberta"), TEXTS)))


def test_a_roberta_tokenizer_s_pairs_are_split_by_its_sequence_ids(roberta):
    assert pair_segments(roberta, "roberta") == "sequence_ids"


def test_a_roberta_pair_s_student_segment_ids_mark_sentence_b_and_its_end(roberta):
    a, b = (len(roberta(text, add_special_tokens=False)["input_ids"]) for text in ("a dog", "dull"))
    types = encode(roberta, ["a dog"], ["dull"], 32, student_segments=True)["token_type_ids"][0]
    assert types == [0] * (1 + a + 2) + [1] * (b + 1)  # <s> a dog </s> </s> | dull </s>


def test_a_roberta_teacher_is_given_no_token_type_ids_for_pairs(roberta):
    assert "token_type_ids" not in encode(roberta, ["a dog"], ["dull"], 32)


def test_a_truncated_roberta_pair_keeps_sentence_b_marked(roberta):
    long = " ".join(TEXTS[:6])
    types = encode(roberta, [long], [long], 12, student_segments=True)["token_type_ids"][0]
    assert types == [0] * 7 + [1] * 5  # <s> A </s> </s> | B </s>, each text cut to 4 tokens


WORDS = st.sampled_from([*" ".join(TEXTS[:3]).split(), "caf\u00e9", "don't", "42", "zyx", "!?"])
SENTENCES = st.lists(WORDS, min_size=1, max_size=12).map(" ".join)


@pytest.fixture(scope="module", params=["roberta", "distilbert"])
def derived(request, roberta):
    """A tokenizer whose pairs carry no token type 1, as training loads it and as the server reads its json."""
    tokenizer = roberta if request.param == "roberta" else distilbert_style(train_tokenizer("bert", TEXTS, 60))
    return tokenizer, tokenizer.backend_tokenizer.to_str()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(pairs=st.lists(st.tuples(SENTENCES, SENTENCES), min_size=1, max_size=6), length=st.integers(8, 24))
def test_the_server_makes_the_segment_ids_training_makes_for_any_pair(derived, pairs, length):
    tokenizer, tokenizer_json = derived
    texts, seconds = (list(side) for side in zip(*pairs, strict=True))
    inputs = {"input_ids": "int64", "attention_mask": "int64", "token_type_ids": "int64"}
    server = TextEncoder(Path("tokenizer.json"), length, inputs, 1, tokenizer_json, pair_segments="sequence_ids")
    served = [row["token_type_ids"].tolist() for row in server.encode(texts, seconds)]
    assert served == list(encode(tokenizer, texts, seconds, length, student_segments=True)["token_type_ids"])


def test_a_slow_tokenizer_without_token_type_1_is_refused_for_pairs():
    with pytest.raises(RecipeError, match="a slow tokenizer gives no sequence ids"):
        pair_segments(ByT5Tokenizer(), "byt5")  # Python, no files: A </s> B </s>, no token types


def test_a_tokenizer_whose_pairs_mark_no_boundary_is_refused_for_pairs(tmp_path):
    tokenizer = load_tokenizer(str(write_roberta(tmp_path / "joined", TEXTS, separated=False)))
    with pytest.raises(RecipeError, match="joined: its tokenizer does not mark sentence B"):
        pair_segments(tokenizer, "joined")


def saved_gpt_tokenizer(tmp_path):
    folder = tmp_path / "gpt"
    train_tokenizer("gpt", ["the caf\u00e9 was fine", *TEXTS], 300).save_pretrained(folder)
    return folder


def test_a_trained_gpt_tokenizer_reads_decomposed_accents_as_composed_ones(tmp_path):
    tokenizer = load_tokenizer(str(saved_gpt_tokenizer(tmp_path)))
    assert tokenizer("cafe\u0301")["input_ids"] == tokenizer("caf\u00e9")["input_ids"]


def test_a_trained_gpt_tokenizers_json_reads_decomposed_accents_as_the_server_does(tmp_path):
    tokenizer = Tokenizer.from_file(str(saved_gpt_tokenizer(tmp_path) / "tokenizer.json"))  # as serve.encoding
    assert tokenizer.encode("cafe\u0301").ids == tokenizer.encode("caf\u00e9").ids


def test_a_gpt_bundle_serves_a_text_with_a_trailing_space_as_trained(tmp_path):
    """A byte-level tokenizer reads a trailing space as a token of its own; training strips it from each cell."""
    inputs = {"input_ids": "int64", "attention_mask": "int64"}
    server = TextEncoder(saved_gpt_tokenizer(tmp_path) / "tokenizer.json", 32, inputs, 1)
    sent, trained = server.encode(["the dog was dull \t", "the dog was dull"])
    assert sent["input_ids"].tolist() == trained["input_ids"].tolist()


def test_a_checkpoint_that_is_not_there_is_named_with_the_setting(tmp_path):
    with pytest.raises(RecipeError, match=r"minilm: cannot load a tokenizer from it .*EDGEDISTILL_TEACHER_INIT"):
        load_tokenizer(str(tmp_path / "minilm"))


def bert_config_folder(folder):
    BertConfig(
        vocab_size=len(BERT_SPECIALS) + 2, hidden_size=8, num_hidden_layers=1, num_attention_heads=1
    ).save_pretrained(folder)
    return folder


def test_a_checkpoint_folder_without_tokenizer_files_is_refused_naming_model_init(tmp_path):
    with pytest.raises(RecipeError, match=r"holds no tokenizer \(none of tokenizer\.json, .*\); model\.init"):
        load_tokenizer(str(bert_config_folder(tmp_path / "weights-only")))


def test_a_checkpoint_folder_with_only_a_vocabulary_file_is_loaded_with_its_words(tmp_path):
    folder = bert_config_folder(tmp_path / "vocab-only")
    (folder / "vocab.txt").write_text("\n".join([*BERT_SPECIALS, "dull", "film"]) + "\n")
    assert load_tokenizer(str(folder)).tokenize("dull film") == ["dull", "film"]


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


def test_a_checkpoint_tokenizer_without_a_pad_or_an_eos_token_is_refused(tmp_path):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "good": 1, "film": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "nopad")
    with pytest.raises(RecipeError, match="has no pad token and no EOS token to pad with"):
        load_tokenizer(str(tmp_path / "nopad"))


def test_cut_share_is_the_share_of_rows_that_reach_max_length():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    # [CLS] a dog [SEP]: 4 tokens; the other is cut at 5
    assert (
        tokenization.cut_share(encode(tokenizer, ["a dog", "a fine film about a dog"], None, 5)["input_ids"], 5) == 0.5
    )


def test_pairs_cut_at_max_length_give_a_warning_naming_the_setting():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    rows = encode(tokenizer, TEXTS[:3], TEXTS[1:4], 8)["input_ids"]
    assert tokenization.cut_warning(rows, "model.max_length", 8, True, "train") == (
        "100% of the train pairs reach it with both texts (model.max_length=8 tokens) and are cut there"
    )


def test_examples_within_max_length_give_no_warning():
    tokenizer = train_tokenizer("bert", TEXTS, 60)
    rows = encode(tokenizer, TEXTS, None, 64)["input_ids"]
    assert tokenization.cut_warning(rows, "model.max_length", 64, False, "train") is None


@pytest.mark.parametrize("family, token", [("bert", "[MASK]"), ("gpt", "<|endoftext|>")])
def test_a_trained_tokenizer_masks_with_a_token_that_is_not_its_pad_token(family, token):
    # the from-scratch recipes' (smoke, sst2-gpt): a GPT's EOS masks, its `<|pad|>` pads
    assert tokenization.mask_token(train_tokenizer(family, TEXTS, 300), 0.1) == token


def test_masking_with_a_tokenizer_without_a_mask_or_an_unknown_token_is_refused_naming_transfer_p_mask():
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[PAD]": 0, "film": 1})), pad_token="[PAD]"
    )
    with pytest.raises(RecipeError, match="neither a mask token nor an unknown token .* set transfer.p_mask to 0"):
        tokenization.mask_token(tok, 0.1)
