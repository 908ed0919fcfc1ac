"""The styles a task's text is written in, for training and serving alike."""

import time
import unicodedata

import pytest
from edgedistill.common import textstyle
from edgedistill.common.textstyle import as_served, styled, tokenise, without_markup
from hypothesis import given
from hypothesis import strategies as st

MARKUP_ALPHABET = "<<<>>09=ab /"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Don't do it.", "do n't do it ."),
        ("It's a CHARMING journey, isn't it?", "it 's a charming journey , is n't it ?"),
        ('I can\'t say (really) "fine"; ok: 3.5 stars...', "i ca n't say ( really ) `` fine '' ; ok : 3.5 stars ..."),
        ("We’ll see&amp;hear<br />it", "we 'll see&hear it"),
    ],
)
def test_tokenise_examples(raw, expected):
    assert tokenise(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Mr. Tsai and Ms. Lee, vs. the rest", "mr. tsai and ms. lee , vs. the rest"),
        ("the U.S. and E.T., e.g. here", "the u.s. and e.t. , e.g. here"),
        ("J. K. Rowling and Malcolm X.", "j. k. rowling and malcolm x."),
        ("it's no. 1 here", "it 's no. 1 here"),
        ("I said no. I am.", "i said no . i am ."),
        ("Really?!? Wow!?", "really ?!? wow !?"),
        ("Jason X... and games, etc...", "jason x ... and games , etc ..."),
        ("when disney announced mr . magoo", "when disney announced mr. magoo"),
    ],
)
def test_tokenise_writes_abbreviations_and_runs_of_marks_as_sst2_does(raw, expected):
    assert tokenise(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('more than another "best man" clone', "more than another `` best man '' clone"),
        ('"Hi," she said.', "`` hi , '' she said ."),
        ('a ("quoted") word and ["another"]', "a ( `` quoted '' ) word and [ `` another '' ]"),
        ('He said "Go."', "he said `` go . ''"),
    ],
)
def test_tokenise_writes_a_double_quote_as_ptb_opening_or_closing_quote(raw, expected):
    assert tokenise(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("\u201cHello,\u201d she said.", "`` hello , '' she said ."),
        ("He said \u201cGo.\u201d", "he said `` go . ''"),
        ("a ( \u201cquoted\u201d ) word", "a ( `` quoted '' ) word"),
        ("\u201cthe end \u201d she said", "`` the end '' she said"),
    ],
)
def test_tokenise_writes_a_curly_double_quote_as_the_ptb_quote_of_its_direction(raw, expected):
    assert tokenise(raw) == expected


@pytest.mark.parametrize(
    ("curly", "straight"),
    [
        ("\u201cHello,\u201d she said.", '"Hello," she said.'),
        ("I don\u2019t know", "I don't know"),
        ("the \u2018best\u2019 one", "the 'best' one"),
    ],
)
def test_tokenise_reads_curly_quotes_as_straight_ones(curly, straight):
    assert tokenise(curly) == tokenise(straight)


@pytest.mark.parametrize("clitic", textstyle.CLITICS)
def test_tokenise_splits_each_clitic_from_its_word(clitic):
    assert tokenise(f"They{clitic} here") == f"they {clitic} here"


def test_raw_style_keeps_case_and_punctuation_and_drops_markup():
    assert styled("  Don't  miss <br />it&amp;more! ", "raw") == "Don't miss it&more!"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("I <3 it, 5 > 4", "i <3 it , 5 > 4"),
        ("done in <10 minutes, >90 % liked it", "done in <10 minutes , >90 % liked it"),
        ("x <= y and y >= z", "x <= y and y >= z"),
        ("<b>I <3 it</b>", "i <3 it"),
    ],
)
def test_a_less_than_sign_before_a_digit_or_equals_sign_opens_no_markup(raw, expected):
    assert tokenise(raw) == expected


@pytest.mark.parametrize("text", ["Zoë's naïve charm", "Xén't good"])
def test_a_ptb_lower_bundle_serves_decomposed_accents_as_composed_ones(text):
    decomposed, composed = unicodedata.normalize("NFD", text), unicodedata.normalize("NFC", text)
    assert as_served([decomposed], "ptb_lower") == as_served([composed], "ptb_lower")


def test_raw_style_keeps_a_heart_before_a_later_greater_than_sign():
    assert styled("I <3 it > all", "raw") == "I <3 it > all"


def test_a_ptb_lower_bundle_serves_a_contraction_as_its_training_text_wrote_it():
    assert as_served(["Don't waste your money!"], "ptb_lower") == ["do n't waste your money !"]


def test_a_ptb_lower_bundle_serves_text_already_in_its_style_unchanged():
    sst2 = "while undisputed is n't exactly a high , it 's a gripping , tidy little movie ."
    assert as_served([sst2], "ptb_lower") == [sst2]


def test_a_ptb_lower_bundle_serves_sst2_text_with_abbreviations_unchanged():
    sst2 = "the script kicks in , and mr. hartley 's distended pace and foot-dragging rhythms follow ."
    assert as_served([sst2], "ptb_lower") == [sst2]


def test_a_ptb_lower_bundle_serves_sst2_text_with_quotes_unchanged():
    sst2 = "the draw ( for `` big bad love '' ) is a solid performance by arliss howard ."
    assert as_served([sst2], "ptb_lower") == [sst2]


def test_a_ptb_lower_bundle_serves_double_quotes_as_sst2_writes_them():
    assert as_served(['I "loved" it'], "ptb_lower") == ["i `` loved '' it"]


@pytest.mark.parametrize(
    ("text", "following", "expected"),
    [
        ("I loved Mr.", "Smith", True),
        ("in the U.S.", "army", True),
        ("it is no.", "5 here", True),
        ("I said no.", "Then", False),
        ("the end.", "Then", False),
        ("", "Then", False),
        ("announced mr .", "magoo", True),
        ("sing, dance, etc.", "The", False),
        ("it is a wash.", "The", False),
    ],
)
def test_ends_with_abbreviation_examples(text, following, expected):
    assert textstyle.ends_with_abbreviation(text, following) is expected


def test_a_raw_bundle_serves_text_as_sent():
    texts = ["I <3 this movie > all  &amp; more"]
    assert as_served(texts, "raw") == texts


def test_a_raw_bundle_serves_text_without_the_whitespace_around_it():
    assert as_served([" great movie \t", "\ndull\r\n"], "raw") == ["great movie", "dull"]


def test_a_raw_bundle_serves_no_pairs_where_none_are_sent():
    assert as_served(None, "raw") is None


@given(st.text(alphabet=MARKUP_ALPHABET, max_size=60))
def test_markup_removal_gives_the_markup_rules_own_output(text):
    assert without_markup(text) == textstyle._TAG.sub(" ", text)


@pytest.mark.serial  # a bound on time
def test_a_long_run_of_less_than_signs_is_tokenised_in_linear_time():
    started = time.perf_counter()
    tokenise("<" * 65536)  # searched from every `<` to the end: seconds
    assert time.perf_counter() - started < 0.5
