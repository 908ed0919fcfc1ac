import argparse
from pathlib import Path

import pytest
from edgedistill.common.arguments import ArgumentParser, WholeWordsHelp, file_in_the_way, input_file, readable_file
from edgedistill.common.recipe import add_recipe_argument

PAGE = "/opt/venv/lib/python3.11/site-packages/edgedistill/docs/export.md#fusion-by-model-type"


def test_a_dash_is_stdin():
    assert input_file("-") == Path("-")


def test_a_file_named_dash_given_with_its_folder_is_not_stdin():
    assert str(input_file("./-")) != "-"


def test_a_file_named_dash_given_with_its_folder_is_that_file():
    assert input_file("./-") == Path.cwd() / "-"


def test_any_other_file_is_kept_as_written():
    assert input_file("data/dev.tsv") == Path("data/dev.tsv")


def narrow_help(epilog: str | None = None, option: str | None = None) -> list[str]:
    """The lines of a 40-column help with `epilog`, and `option` as the help of its one option."""
    parser = argparse.ArgumentParser(
        prog="p", formatter_class=lambda prog: WholeWordsHelp(prog, width=40), epilog=epilog
    )
    parser.add_argument("--flag", help=option)
    return parser.format_help().splitlines()


def test_a_readable_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="nope.txt: no such file"):
        readable_file(str(tmp_path / "nope.txt"))


def test_a_readable_file_that_is_a_folder_is_refused_saying_so(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="a folder, not a file"):
        readable_file(str(tmp_path))


def test_a_readable_file_may_be_stdin():
    assert readable_file("-") == Path("-")


def test_a_hyphenated_path_in_the_epilog_stays_on_one_line():
    assert f"{PAGE}." in [line.strip() for line in narrow_help(epilog=f"Read {PAGE}. Then go on.")]


def test_a_hyphenated_path_in_an_options_help_stays_on_one_line():
    assert PAGE in [line.strip() for line in narrow_help(option=f"see {PAGE}")]


def test_the_help_is_still_wrapped_between_words():
    assert max(len(line) for line in narrow_help(epilog="word " * 40)) <= 40


def test_a_no_break_space_in_the_help_holds_its_words_together():
    assert "20\u00a0ms" in " ".join(narrow_help(epilog="word " * 6 + "20\u00a0ms " + "word " * 6))


def test_a_folder_below_a_file_has_that_file_in_its_way(tmp_path):
    (tmp_path / "file").write_text("")
    assert file_in_the_way(tmp_path / "file" / "a" / "b") == tmp_path / "file"


def test_a_folder_still_to_make_has_nothing_in_its_way(tmp_path):
    assert file_in_the_way(tmp_path / "a" / "b") is None


def recipe_parser(recipe: bool = True) -> ArgumentParser:
    """A command's parser with a `--jobs` option, which takes a recipe and its overrides where `recipe`."""
    parser = ArgumentParser(prog="p")
    if recipe:
        add_recipe_argument(parser, "distill")
    parser.add_argument("--jobs", type=int)
    return parser


def refusal(argv: list[str], capsys) -> tuple[int, str]:
    """The exit status and the error line of `recipe_parser()` refusing `argv`."""
    with pytest.raises(SystemExit) as exit_:
        recipe_parser().parse_known_args(argv)
    return exit_.value.code, capsys.readouterr().err.splitlines()[-1]


def test_an_override_holding_a_space_before_the_recipe_is_refused_saying_to_give_the_recipe_first(capsys):
    expected = "p: error: --a.b={c: 1} came where the recipe goes: give the recipe first, then the overrides"
    assert refusal(["--a.b={c: 1}", "sst2"], capsys)[1] == expected


def test_an_override_before_the_recipe_is_a_usage_error(capsys):
    assert refusal(["--a.b={c: 1}", "sst2"], capsys)[0] == 2


def test_a_misspelt_option_among_the_overrides_is_answered_with_the_nearest_option(capsys):
    assert "did you mean --jobs? " in refusal(["sst2", "--job=2"], capsys)[1]


def test_a_misspelt_short_option_among_the_overrides_is_a_usage_error(capsys):
    assert refusal(["sst2", "-j", "2"], capsys)[0] == 2


def test_overrides_after_the_recipe_are_left_to_the_command():
    assert recipe_parser().parse_known_args(["sst2", "--finetune.optim={lr: 0.1}", "--name=x"])[1] == [
        "--finetune.optim={lr: 0.1}",
        "--name=x",
    ]


def test_a_parser_without_a_recipe_leaves_what_it_does_not_know_to_its_caller():
    assert recipe_parser(recipe=False).parse_known_args(["--job=2"])[1] == ["--job=2"]
