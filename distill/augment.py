"""Transfer-set text: Tang et al. (2019) augmentation of labelled sentences and sentence splitting of raw text.

Text is a list of whitespace-separated words, every transfer-set text written in the recipe's `Style`
(`common.textstyle`). Randomness comes only from the `random.Random` passed in.
"""

import array
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator

from edgedistill.common.textstyle import CLITICS, Style, ends_with_abbreviation, styled

Replacer = Callable[[list[str], int, random.Random], str]
"""Gives a substitute for words[index], e.g. a masked LM's top-k prediction or a same-POS word."""

MAX_NGRAM = 5


def augment(
    words: list[str],
    rng: random.Random,
    p_mask: float,
    p_replace: float,
    p_ngram: float,
    mask_token: str,
    replace: Replacer | None,
) -> list[str]:
    """One augmented copy of `words`, in this order (Tang et al. 2019, section 3.1):

    1. For each word draw u ~ U[0, 1): u < p_mask puts `mask_token` in its place; otherwise
       u < p_mask + p_replace puts `replace(words, index, rng)` there (skipped when `replace` is None).
       Masking and replacement are thus exclusive, with overall probabilities p_mask and p_replace;
       `replace` always sees the original words.
    2. With probability p_ngram keep only a random n-gram of the result, n uniform in 1..5, capped at its length.
    """
    if min(p_mask, p_replace) < 0 or p_mask + p_replace > 1 or not 0 <= p_ngram <= 1:
        raise ValueError(
            f"need p_mask, p_replace >= 0, p_mask + p_replace <= 1, 0 <= p_ngram <= 1; got "
            f"{p_mask}, {p_replace}, {p_ngram}"
        )
    out = []
    for index, word in enumerate(words):
        u = rng.random()
        if u < p_mask:
            out.append(mask_token)
        elif replace is not None and u < p_mask + p_replace:
            out.append(replace(words, index, rng))
        else:
            out.append(word)
    if out and rng.random() < p_ngram:
        n = min(rng.randint(1, MAX_NGRAM), len(out))
        start = rng.randint(0, len(out) - n)
        out = out[start : start + n]
    return out


def augment_examples(
    examples: list[tuple[str, ...]],
    n_iter: int,
    rng: random.Random,
    *,
    p_mask: float,
    p_replace: float,
    p_ngram: float,
    mask_token: str,
    replace: Replacer | None,
    bar=None,
) -> list[tuple[str, ...]]:
    """Up to `n_iter` augmented samples per example (one text, or the two sides of a pair, each side augmented on
    its own as Tang et al. do for their pair tasks), sides as space-joined strings, first occurrence kept.

    Samples with an empty side, repeats, and samples equal to any of `examples` (not only their own source) are
    dropped, so the transfer set gains only new examples. `bar` (`common.progress.bar`) advances by one per example.
    """
    seen = {tuple(" ".join(side.split()) for side in example) for example in examples}
    out = []
    for example in examples:
        sides = [side.split() for side in example]
        for _ in range(n_iter):
            sample = tuple(
                " ".join(augment(words, rng, p_mask, p_replace, p_ngram, mask_token, replace)) for words in sides
            )
            if all(sample) and sample not in seen:
                seen.add(sample)
                out.append(sample)
        if bar is not None:
            bar.update()
    return out


def vocab_replacer(vocabulary: Iterable[str]) -> Replacer:
    """A `Replacer` that ignores the context and draws a word uniformly from `vocabulary` (a word as often as it
    occurs there), held as int32 indices into its distinct words: 4 bytes a word, however many it reads."""
    distinct: dict[str, int] = {}
    choices = array.array("i", (distinct.setdefault(word, len(distinct)) for word in vocabulary))
    if not choices:
        raise ValueError("vocab_replacer needs a non-empty vocabulary")
    words_of = list(distinct)

    def replace(words: list[str], index: int, rng: random.Random) -> str:
        return words_of[rng.choice(choices)]

    return replace


# A sentence ends after . ! ? (and the Arabic question mark and full stop, the Devanagari danda) and a space, not before
# another stop; after the full-width 。！？ of Chinese and Japanese, which no space need follow. The closing quotes and
# brackets after a stop end its sentence: attached (`."`, `。」`) or, as `ptb_lower` writes them, tokens of their own
# (`. ''`), so none starts the next; where they are attached and a lower-case word follows, the quote was a part of its
# sentence (`"Well done!" said Emma.`), which goes on; so too where Chinese or Japanese follows them unspaced
# (`「楽しかった。」と言った。`, or in `ptb_lower` `。 '' 他说`), as those languages write no space after a sentence.
# Closers attached come first and each later run after a space: one way to read a run, where `(?: ?C+)*` would try
# every split of it.
_UNSPACED_CHAR = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"  # kana and CJK ideographs
_STOP, _FULL_STOP, _CLOSE = "[.!?؟۔।]", "[。！？]", "[\"')\\]”’〉》」』】〕〗〙〛）］｝｠｣]"
_SENTENCE_END = re.compile(
    rf"(?<={_STOP})(?:{_CLOSE}+(?: {_CLOSE}+)* (?![a-zß-ÿ])|(?: {_CLOSE}+)* )(?!{_STOP}|{_CLOSE}+(?: |$))"
    rf"|(?<={_FULL_STOP})(?!(?:{_CLOSE}+(?: {_CLOSE}+)*|(?: {_CLOSE}+)+) ?{_UNSPACED_CHAR})"
    rf"{_CLOSE}*(?: {_CLOSE}+)* ?(?!{_FULL_STOP}|{_CLOSE})"
)
_WORD = re.compile(r"\w")
_UNSPACED = re.compile(_UNSPACED_CHAR)
MIN_WORDS = 3


def split_words(text: str) -> list[str]:
    """The words of `text`: what spaces separate, each Chinese or Japanese character (kana, ideograph) one of its own,
    as those languages are written unspaced."""
    return _UNSPACED.sub(r" \g<0> ", text).split()


def split_sentences(text: str, style: Style = "ptb_lower") -> list[str]:
    """Sentences of a raw text in `style`, split after . ! ? (and ؟ ۔ ।) and the full-width 。！？ (kept, with the
    closing quotes and brackets after them), but not after an abbreviation ("Mr. Smith",
    `textstyle.ends_with_abbreviation`), dropping those with under 3 words.

    HTML tags (e.g. IMDb's "<br />") and entities are removed first; a word is a token with a letter
    or digit, so "wow !" and "it 's ." are dropped, or a Chinese or Japanese character (kana, ideograph).
    """
    sentences, pieces = [], []  # the pieces of the sentence being read, joined once it ends
    for piece in _pieces(styled(text, style)):
        if pieces and not ends_with_abbreviation(pieces[-1], piece):
            sentences.append(" ".join(pieces))
            pieces = []
        pieces.append(piece)
    sentences.append(" ".join(pieces))
    return [s for s in sentences if _words(s) >= MIN_WORDS]


def _pieces(text: str) -> Iterator[str]:
    """`text` cut at each `_SENTENCE_END`: a piece keeps its stop and closers, not the space after them."""
    start = 0
    for end in _SENTENCE_END.finditer(text):
        yield text[start : end.end()].rstrip(" ")
        start = end.end()
    yield text[start:]


def _words(sentence: str) -> int:
    """Its words (`split_words`) with a letter or digit, or Chinese or Japanese."""
    return sum(bool(_WORD.search(word) or _UNSPACED.match(word)) for word in split_words(sentence))


_SPLIT_CLITIC = re.compile(rf" ({'|'.join(CLITICS)})\b")
_BRACKET_TOKEN = re.compile(r"-[lr][rcs]b-")
_NON_ALNUM = re.compile(r"[\W_]+")


def normalise(text: str) -> str:
    """Letters and digits only, lower-case, single spaces: a key to find dev/test sentences in other text.

    Tokenisation does not change the key: clitics are re-attached and apostrophes dropped
    ("do n't" and "don't" -> "dont"), PTB bracket tokens (-lrb-, -rrb-) are dropped. Nor does how the
    text is encoded: accents composed or not are the same (NFC), and invisible format characters (zero-width
    spaces and joiners, soft hyphens, direction marks) are dropped. Full-width forms and ligatures stay apart
    from their plain letters: folding them (NFKC) would change the keys of 79 lines of the shared data, and with
    them the transfer sets behind the recorded figures.
    """
    if not text.isascii():
        text = "".join(char for char in unicodedata.normalize("NFC", text) if unicodedata.category(char) != "Cf")
    text = _BRACKET_TOKEN.sub(" ", text.lower().replace("\u2019", "'"))
    text = _SPLIT_CLITIC.sub(r"\1", text).replace("'", "")
    return " ".join(_NON_ALNUM.sub(" ", text).split())
