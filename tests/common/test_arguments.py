from pathlib import Path

from edgedistill.common.arguments import input_file


def test_a_dash_is_stdin():
    assert input_file("-") == Path("-")


def test_a_file_named_dash_given_with_its_folder_is_not_stdin():
    assert str(input_file("./-")) != "-"


def test_a_file_named_dash_given_with_its_folder_is_that_file():
    assert input_file("./-") == Path.cwd() / "-"


def test_any_other_file_is_kept_as_written():
    assert input_file("data/dev.tsv") == Path("data/dev.tsv")
