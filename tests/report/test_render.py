"""Report sections drawn from one artifact, without a run: fast checks of what they show."""

import json

from report import render

ROWS = [
    {"student": "teacher", "arch": "teacher", "dev_accuracy": 0.9, "dev_macro_f1": 0.8, "retention": 1.0},
    {"student": "cnn", "arch": "cnn", "dev_accuracy": 0.85, "dev_macro_f1": 0.6, "retention": 0.75},
]


def distillation_markdown(tmp_path) -> str:
    (tmp_path / "distill-summary.json").write_text(json.dumps(ROWS))
    page = render.Page("report")
    render._distillation(page, tmp_path)
    return "\n".join(page.md)


def test_distillation_section_shows_the_tables_own_columns(tmp_path):
    assert "| student | arch | dev_accuracy | dev_macro_f1 | retention |" in distillation_markdown(tmp_path)


def test_distillation_section_shows_each_row(tmp_path):
    assert "| cnn | cnn | 0.85 | 0.6 | 0.75 |" in distillation_markdown(tmp_path)
