"""The segment ids the pair students read, from a tokenized pair's sequence ids."""

from edgedistill.common.segments import from_sequence_ids, separated

ROBERTA_PAIR = [None, 0, 0, None, None, 1, None]  # <s> A A </s> </s> B </s>


def test_sentence_b_and_the_specials_after_it_are_segment_1():
    assert from_sequence_ids(ROBERTA_PAIR) == [0, 0, 0, 0, 0, 1, 1]


def test_a_single_text_is_all_segment_0():
    assert from_sequence_ids([None, 0, 0, None]) == [0, 0, 0, 0]


def test_a_bert_pair_gets_its_token_type_ids():
    assert from_sequence_ids([None, 0, None, 1, None]) == [0, 0, 0, 1, 1]  # [CLS] a [SEP] b [SEP]


def test_a_pair_with_a_special_token_between_the_texts_is_separated():
    assert separated(ROBERTA_PAIR)


def test_a_pair_with_b_right_after_a_is_not_separated():
    assert not separated([None, 0, 0, 1, None])


def test_a_pair_without_sentence_b_is_not_separated():
    assert not separated([None, 0, 0, None])
