import random
import time
import tracemalloc

import pytest
from edgedistill.common.textstyle import CLITICS, tokenise
from edgedistill.distill.augment import (
    augment,
    augment_examples,
    normalise,
    split_sentences,
    split_words,
    vocab_replacer,
)
from hypothesis import given
from hypothesis import strategies as st

SENTENCE = ["it", "'s", "a", "charming", "and", "often", "affecting", "journey", ",", "the", "cast", "shines", "."]
VOCAB = ["good", "bad", "film", "movie", "dull"]


def _augment(words, seed, p_mask=0.2, p_replace=0.2, p_ngram=0.25, replace=None):
    replace = replace or vocab_replacer(VOCAB)
    return augment(words, random.Random(seed), p_mask, p_replace, p_ngram, "[MASK]", replace)


def test_same_seed_same_output_and_different_seeds_differ():
    first = [_augment(SENTENCE, seed) for seed in range(5)]
    assert first == [_augment(SENTENCE, seed) for seed in range(5)]
    assert len({" ".join(words) for words in first}) > 1


def test_mask_probability_one_masks_every_word():
    assert _augment(SENTENCE, 0, p_mask=1.0, p_replace=0.0, p_ngram=0.0) == ["[MASK]"] * len(SENTENCE)


def test_zero_probabilities_leave_words_unchanged():
    assert _augment(SENTENCE, 0, p_mask=0.0, p_replace=0.0, p_ngram=0.0) == SENTENCE


def test_replacement_is_skipped_without_a_replacer():
    words = augment(SENTENCE, random.Random(0), 0.0, 1.0, 0.0, "[MASK]", None)
    assert words == SENTENCE


def test_replacer_gets_the_original_words_and_the_right_index():
    calls = []

    def replace(words, index, rng):
        calls.append((list(words), index))
        return f"<{index}>"

    out = _augment(SENTENCE, 3, p_mask=0.5, p_replace=0.5, p_ngram=0.0, replace=replace)
    assert len(out) == len(SENTENCE)
    replaced = [i for i, word in enumerate(out) if word != "[MASK]"]
    assert all(out[i] == f"<{i}>" for i in replaced)
    assert [index for _, index in calls] == replaced
    assert all(words == SENTENCE for words, _ in calls)
    assert 0 < len(replaced) < len(SENTENCE)


def test_invalid_probabilities_are_rejected():
    with pytest.raises(ValueError, match="p_mask"):
        _augment(SENTENCE, 0, p_mask=0.7, p_replace=0.5)


@given(
    words=st.lists(st.text(alphabet="abcxyz'.", min_size=1, max_size=6), min_size=1, max_size=30),
    seed=st.integers(0, 2**32 - 1),
)
def test_ngram_is_a_contiguous_piece_of_one_to_five_words(words, seed):
    out = augment(words, random.Random(seed), 0.0, 0.0, 1.0, "[MASK]", None)
    assert 1 <= len(out) <= min(5, len(words))
    starts = [i for i in range(len(words) - len(out) + 1) if words[i : i + len(out)] == out]
    assert starts


def test_empty_input_gives_empty_output():
    assert _augment([], 0, p_ngram=1.0) == []


def _augment_texts(texts: list[str], n_iter: int, rng: random.Random, **options) -> list[str]:
    """`augment_examples` of single texts, as texts."""
    return [sample for (sample,) in augment_examples([(text,) for text in texts], n_iter, rng, **options)]


def test_augment_examples_respects_n_iter_and_drops_repeats_sources_and_empties():
    texts = ["a b c d e f g", "good film", "a b"]
    kwargs = dict(p_mask=0.3, p_replace=0.3, p_ngram=0.5, mask_token="[MASK]", replace=vocab_replacer(VOCAB))
    out = _augment_texts(texts, 8, random.Random(0), **kwargs)
    assert 0 < len(out) <= 8 * len(texts)
    assert len(out) == len(set(out))
    assert not set(out) & set(texts)
    assert all(sample for sample in out)
    assert all(sample.strip() == sample for sample in out)
    assert out == _augment_texts(texts, 8, random.Random(0), **kwargs)
    assert _augment_texts(texts, 0, random.Random(0), **kwargs) == []


def test_augment_examples_without_changes_adds_nothing():
    kwargs = dict(p_mask=0.0, p_replace=0.0, p_ngram=0.0, mask_token="[MASK]", replace=None)
    assert _augment_texts(["a  b c", "d e"], 5, random.Random(0), **kwargs) == []


def test_augment_examples_keeps_first_occurrence_order():
    kwargs = dict(p_mask=1.0, p_replace=0.0, p_ngram=0.0, mask_token="[MASK]", replace=None)
    assert _augment_texts(["a b", "c d", "e"], 3, random.Random(0), **kwargs) == ["[MASK] [MASK]", "[MASK]"]


def test_augment_examples_advances_the_bar_once_per_example():
    class Bar:
        n = 0

        def update(self, n=1):
            self.n += n

    bar = Bar()
    kwargs = dict(p_mask=0.5, p_replace=0.0, p_ngram=0.0, mask_token="[MASK]", replace=None)
    augment_examples([("a b",), ("c d",), ("e",)], 2, random.Random(0), bar=bar, **kwargs)
    assert bar.n == 3


def test_vocab_replacer_draws_as_a_choice_over_its_words_would():
    words = ["a", "b", "a", "c"] * 5
    replace = vocab_replacer(iter(words))
    ours, reference = random.Random(3), random.Random(3)
    assert [replace(SENTENCE, 0, ours) for _ in range(30)] == [reference.choice(words) for _ in range(30)]


def test_vocab_replacer_holds_4_bytes_a_word_read():
    tracemalloc.start()
    replace = vocab_replacer(f"w{i % 10}" for i in range(200_000))  # each word its own string, as split gives
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert held < 1_000_000, replace  # a tuple of the words held 11 MB


def test_vocab_replacer_draws_from_its_vocabulary():
    replace = vocab_replacer(VOCAB)
    rng = random.Random(0)
    drawn = {replace(SENTENCE, 2, rng) for _ in range(50)}
    assert drawn <= set(VOCAB)
    assert len(drawn) > 1
    with pytest.raises(ValueError, match="non-empty"):
        vocab_replacer([])


def test_split_sentences_splits_cleans_and_drops_short_ones():
    raw = "This movie rocks! I loved it.<br /><br />Wow!! Don't miss the ending... Truly great, it's a gem?"
    assert split_sentences(raw) == [
        "this movie rocks !",
        "i loved it .",
        "do n't miss the ending ...",
        "truly great , it 's a gem ?",
    ]


@pytest.mark.parametrize("style", ["raw", "ptb_lower"])
def test_split_sentences_splits_no_sentence_after_an_abbreviation(style):
    raw = "I loved Mr. Smith and Dr. Jones in it. It is no. 5 on my list, e.g. above Star Wars. I said no. Then I left."
    assert len(split_sentences(raw, style)) == 4


def test_split_sentences_keeps_a_sentence_without_final_punctuation():
    assert split_sentences("an ok film overall") == ["an ok film overall"]
    assert split_sentences("Short. Too.") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  It 's   a CHARMING journey . ", "its a charming journey"),
        ("it's a charming journey.", "its a charming journey"),
        ("do n't -lrb- really -rrb- go !", "dont really go"),
        ("Don't (really) go!", "dont really go"),
        ("3.5 stars_for café", "3 5 stars for café"),
        ("...", ""),
        ("cafe\u0301 cafe\u0301", "café café"),  # decomposed accents: as the composed ones above
        ("hel\u200blo wo\u00adrld \u200fok\u202c", "hello world ok"),  # zero-width space, soft hyphen, marks
    ],
)
def test_normalise_examples(text, expected):
    assert normalise(text) == expected


def test_normalise_matches_a_raw_sentence_with_its_tokenised_form():
    raw = "Don't miss it: the cast's work is (mostly) great!"
    assert normalise(raw) == normalise(split_sentences(raw)[0])


@pytest.mark.parametrize("clitic", CLITICS)
def test_normalise_keys_a_word_with_each_clitic_as_its_tokenised_form(clitic):
    assert normalise(f"They{clitic} here") == normalise(tokenise(f"They{clitic} here"))


def test_chinese_text_splits_after_full_width_sentence_ends():
    raw = "这部电影很好看。演员的表演非常出色！ 你还想再看一遍吗？"
    assert split_sentences(raw, "raw") == ["这部电影很好看。", "演员的表演非常出色！", "你还想再看一遍吗？"]


@pytest.mark.parametrize(
    ("raw", "sentences"),
    [
        ("هل شاهدت هذا الفيلم؟ إنه رائع جدا حقا.", ["هل شاهدت هذا الفيلم؟", "إنه رائع جدا حقا."]),
        ("यह फिल्म बहुत अच्छी है। मुझे यह पसंद आई।", ["यह फिल्म बहुत अच्छी है।", "मुझे यह पसंद आई।"]),
    ],
)
def test_arabic_and_hindi_text_splits_after_their_own_sentence_ends(raw, sentences):
    assert split_sentences(raw, "raw") == sentences


def test_a_japanese_sentence_counts_each_character_as_a_word():
    assert split_sentences("とても良い。映画。", "raw") == ["とても良い。"]  # 5 characters kept, 2 dropped


@pytest.mark.parametrize(
    ("raw", "style", "sentences"),
    [
        ('He said "Go home now." Then he left.', "raw", ['He said "Go home now."', "Then he left."]),
        ("It was (really great.) And then it ended.", "raw", ["It was (really great.)", "And then it ended."]),
        (
            "It was (really great.) And then it ended.",
            "ptb_lower",
            ["it was ( really great . )", "and then it ended ."],
        ),
        ("he said `` go home now . '' then he left .", "ptb_lower", ["he said `` go home now . ''", "then he left ."]),
        ("映画を見た（とても良かった。）", "raw", ["映画を見た（とても良かった。）"]),
        ("「本当に良かった。」【感想】次も見たい。", "raw", ["「本当に良かった。」", "【感想】次も見たい。"]),
    ],
)
def test_a_closing_quote_or_bracket_after_a_sentence_end_stays_with_its_sentence(raw, style, sentences):
    assert split_sentences(raw, style) == sentences


@pytest.mark.parametrize("style", ["raw", "ptb_lower"])
@pytest.mark.parametrize("raw", ["彼は「楽しかった。」と言った。", "他说：“我很高兴见到你。”然后他走了出去。"])
def test_chinese_or_japanese_straight_after_a_closer_goes_on_with_its_sentence(raw, style):
    assert len(split_sentences(raw, style)) == 1


def test_a_quote_ending_in_a_stop_before_a_lower_case_word_stays_in_its_sentence():
    raw = '"Well done, Mrs. Martin!" thought Emma. She smiled at him.'
    assert split_sentences(raw, "raw") == ['"Well done, Mrs. Martin!" thought Emma.', "She smiled at him."]


def test_an_apostrophe_opening_the_next_sentence_starts_it():
    assert split_sentences("I liked it. 'Twas a fine film.", "raw") == ["I liked it.", "'Twas a fine film."]


def test_split_words_makes_each_chinese_or_japanese_character_a_word():
    assert split_words("我爱 the film 映画") == ["我", "爱", "the", "film", "映", "画"]


def test_split_sentences_in_raw_style_keeps_the_words_as_written():
    raw = "This movie rocks! I loved it.<br /><br />Wow!! Don't miss the ending..."
    assert split_sentences(raw, "raw") == ["This movie rocks!", "I loved it.", "Don't miss the ending..."]


def test_augment_examples_changes_each_side_of_a_pair_on_its_own_and_drops_the_originals():
    pairs = [("a b c d", "e f g h"), ("i j", "k l")]
    kwargs = dict(p_mask=0.5, p_replace=0.0, p_ngram=0.0, mask_token="[MASK]", replace=None)
    out = augment_examples(pairs, 6, random.Random(0), **kwargs)
    assert all(len(sample) == 2 for sample in out)
    assert all(all(sample) for sample in out)
    assert not set(out) & set(pairs)
    assert len(set(out)) == len(out)
    assert out == augment_examples(pairs, 6, random.Random(0), **kwargs)


@pytest.mark.serial  # a bound on time
def test_a_long_run_of_abbreviations_is_split_in_linear_time():
    started = time.perf_counter()
    split_sentences("Mr. " * 100_000, "raw")  # joined piece by piece, re-reading the sentence so far: seconds
    assert time.perf_counter() - started < 1.5


@pytest.mark.serial  # a bound on time
def test_a_long_run_of_closing_quotes_is_split_in_linear_time():
    started = time.perf_counter()
    split_sentences("It ended. " + "'" * 40 + "x", "raw")  # read as runs of runs, tried every way: minutes
    assert time.perf_counter() - started < 0.5
