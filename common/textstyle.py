"""The style a task's text is written in, which training and serving share.

A `Style` says how a task's text is written: `raw` as given; `ptb_lower` lower-cased and PTB-tokenised as in
SST-2 ("it 's a charming journey ."). The transfer set writes every text in the recipe's style (`styled`); a
bundle records the style, and the server writes each text it is sent in it (`as_served`) before its tokenizer.
"""

import html
import re
import unicodedata
from typing import Literal

Style = Literal["raw", "ptb_lower"]

# Markup: `<` up to the next `>`, as scraped reviews hold it ("<br />", "< SPOILER >"). A `<` before a digit or `=`
# opens none (HTML reads it as text too), so "I <3 it", "under <10 min" and "x <= y" keep their words when a `>` comes
# later ("... 5 > 4"), which would otherwise close a span over them. The shared data's text is styled the same either way.
_TAG = re.compile(r"<(?![\d=])[^>]*>")
# The clitics `tokenise` splits from their word, as SST-2 writes them ("do n't"); `normalise` keys join them back.
CLITICS = ("n't", "'s", "'re", "'ve", "'ll", "'d", "'m")
_CLITIC = re.compile(rf"(?<=\w)({'|'.join(CLITICS)})\b")
# Words written with their period, as SST-2's PTB tokenisation writes them: titles and the like ("mr.", "vs.",
# "etc."), "no." before a number, dotted initialisms ("u.s.", "e.t."), and initials ("j. k."; not "a." or "i.",
# which end sentences); not before another period ("x ...", as SST-2 writes it). After a title, an initialism or an
# initial no sentence ends (`ends_with_abbreviation`); after one of `_MAY_END` ("a wash.", "etc.") one may.
_TITLES = ("mrs?", "ms", "dr", "jr", "sr", "st", "vs", "bros", "prof", "gen", "gov", "sen", "rep", "mt", "lt", "capt")
_MAY_END = ("etc", "inc", "co", "corp", "ltd", "al", "sept", "wash")


def _abbreviation(words: tuple[str, ...]) -> str:
    """A regex of an abbreviation of lower-case text: one of `words` with its period, `no.` before a number, a dotted
    initialism or an initial."""
    return rf"\b(?:(?:{'|'.join(words)})\.(?!\.)|no\.(?= ?\d)|[a-z](?:\.[a-z])+\.(?!\.)|(?<!')[b-hj-z]\.(?![\w.]))"


# A double quote as PTB's tokenizer (and so SST-2) writes it: `` where it opens (at the start, after whitespace or an
# opening bracket), '' where it closes. A curly one says which it is; a curly single quote reads as a straight one.
_OPENING_QUOTE = re.compile(r'(?<![^\s(\[{])"')
_CURLY_QUOTES = str.maketrans({"\u201c": " `` ", "\u201d": " '' ", "\u2018": "'", "\u2019": "'"})
# An abbreviation is kept whole; "..." and a run of ! and ? ("?!") stay one token; . and , between digits stay inside
# numbers ("3.5", "1,000"). The lookahead, which every alternative starts with, lets the regex engine skip the other
# characters fast.
_PUNCT = re.compile(
    rf"(?=[.,!?;:()]|\b[a-z.]{{2,15}}(?!\w))"
    rf"(?:(?P<kept>{_abbreviation(_TITLES + _MAY_END)})|(?P<split>\.\.\.|[!?]+|[;:()]|(?<!\d)[.,]|[.,](?!\d)))"
)
_NON_FINAL = re.compile(_abbreviation(_TITLES), re.IGNORECASE)
# A title already tokenised apart from its period ("mr . magoo", as some scraped reviews are written)
_NAME_TITLE = r"(?:mrs?|ms|dr)"
_SPLIT_TITLE = re.compile(rf"\b({_NAME_TITLE}) \.(?= \w)")
_NAME_TITLE_WORD = re.compile(_NAME_TITLE, re.IGNORECASE)


def without_markup(text: str) -> str:
    """`text` with each markup span (`_TAG`) replaced by a space. A span ends at a `>`, so only the text up to the last
    `>` is searched: past it, each `<` would scan to the end of the text in vain (quadratic in a run of `<`)."""
    end = text.rfind(">") + 1
    return _TAG.sub(" ", text[:end]) + text[end:]


def tokenise(text: str) -> str:
    """Lower-case and PTB-style tokens, roughly as in SST-2: 'Don't say "hi".' -> "do n't say `` hi '' ."."""
    # Accents composed, as the data is written: to the clitic rule a decomposed accent is a mark, not a letter, so a
    # client's "xe\u0301n't" would keep its "n't" where "x\u00e9n't" is split.
    text = unicodedata.normalize("NFC", text)
    text = html.unescape(without_markup(text)).lower().translate(_CURLY_QUOTES)
    if '"' in text:
        text = _OPENING_QUOTE.sub(" `` ", text).replace('"', " '' ")
    if "'" in text:  # every clitic holds one
        text = _CLITIC.sub(r" \1", text)
    if " ." in text:
        text = _SPLIT_TITLE.sub(r"\1.", text)
    text = _PUNCT.sub(_spaced, text)
    return " ".join(text.split())


def _spaced(match: re.Match) -> str:
    """A punctuation token with a space either side; an abbreviation as it is."""
    return match["kept"] or f" {match['split']} "


def ends_with_abbreviation(text: str, following: str) -> bool:
    """Whether `text` ends with an abbreviation (in either case) after which no sentence ends, `following` being the
    text after it: "Mr." (or a tokenised "Mr .") before "Smith", "no." before "5"; not "etc." or "a wash."."""
    words = text.rsplit(None, 2)  # the last words alone: read from the end of a long text, not copied whole
    last = words[-1] if words else ""
    if last == "." and len(words) > 1 and _NAME_TITLE_WORD.fullmatch(words[-2]):
        return True
    return any(match.end() == len(last) for match in _NON_FINAL.finditer(f"{last} {following[:2]}"))


def styled(text: str, style: Style) -> str:
    """`text` written in `style`: `ptb_lower` tokenises it; `raw` only removes HTML tags and entities and
    collapses whitespace."""
    if style == "ptb_lower":
        return tokenise(text)
    return " ".join(html.unescape(without_markup(text)).split())


def as_served(texts: list[str] | None, style: Style) -> list[str] | None:
    """`texts` as a bundle of `style` hands them to its tokenizer: tokenised for `ptb_lower`, so that a client's
    "Don't" reads as the model's training text "do n't"; for `raw`, as sent less the whitespace around each, as the
    data loader reads a cell (a byte-level tokenizer would read a trailing space or tab as a token the model never
    saw; `raw`'s markup removal is for scraped text, which clients do not send). None (a task without pairs) stays
    None."""
    if texts is None:
        return None
    return [tokenise(text) for text in texts] if style == "ptb_lower" else [text.strip() for text in texts]
