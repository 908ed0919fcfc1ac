"""Command-line argument types the commands share."""

import argparse
import re
import textwrap
from collections.abc import Callable
from pathlib import Path


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser without abbreviated options: `--forc` is refused as unknown, not read as `--force`. Its
    subcommands' parsers are of this class too. One that takes a recipe (`common.recipe.add_recipe_argument`) leaves
    the arguments it does not know to be the recipe's overrides, and refuses those that are none
    (`refuse_non_overrides`, by its `not_an_override`)."""

    not_an_override: Callable[[list[str], int, list[str]], str | None] | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        if self.not_an_override is not None:
            self.refuse_non_overrides(namespace.recipe, rest)
        return namespace, rest

    def refuse_non_overrides(self, recipe: str, overrides: list[str]) -> None:
        """A usage error for an override given before the recipe, which argparse reads as the recipe where it holds a
        space (`'--finetune.optim={lr: 1e-4}' sst2`), and for a misspelt option among the `overrides`, naming the
        nearest of this parser's options; here, not where the overrides are read, as only the parser knows them."""
        if recipe.startswith("--"):
            self.error(f"{recipe} came where the recipe goes: give the recipe first, then the overrides")
        options = [option for action in self._actions for option in action.option_strings]
        for index in range(len(overrides)):
            if refusal := self.not_an_override(overrides, index, options):
                self.error(refusal)


def count(value: str) -> int:
    """An argument that counts something, so is at least 1 (`--jobs`, `--batch-size`)."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def input_file(value: str) -> Path:
    """A file to read, where `-` is stdin: a file named `-` is given as `./-`, which `Path` would make `-` too."""
    path = Path(value)
    return path.absolute() if value != "-" and str(path) == "-" else path


def readable_file(value: str) -> Path:
    """An `input_file` that exists now, or `-`: a misspelt path is refused as the argument is read, before its
    command starts anything."""
    path = input_file(value)
    if str(path) != "-" and not path.is_file():
        raise argparse.ArgumentTypeError(f"{value}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    return path


def file_in_the_way(folder: Path) -> Path | None:
    """The file that stands where `folder`, or a folder above it, would be (so that it cannot be made); None where
    there is none."""
    for path in (folder, *folder.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def output_folder(value: str) -> Path:
    """A folder to write into, made where missing: one a file stands in the way of is refused as the argument is
    read."""
    path = Path(value)
    if (file := file_in_the_way(path)) is not None:
        raise argparse.ArgumentTypeError(f"{value}: {file} is a file, not a folder")
    return path


class WholeWordsHelp(argparse.HelpFormatter):
    """argparse's help, wrapped at spaces only: a path or anchor in it (`site-packages/...`,
    `#fusion-by-model-type`) stays whole, so that it can be copied."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(_spaced(text), width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(indent + line for line in self._split_lines(text, width - len(indent)))


def _spaced(text: str) -> str:
    """`text` with each run of ASCII whitespace one space, as argparse reads help (a no-break space holds)."""
    return re.sub(r"\s+", " ", text, flags=re.ASCII).strip()
