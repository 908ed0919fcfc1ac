import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common import settings
from edgedistill.common.config.training import RuntimeConfig, TransferConfig
from edgedistill.common.data import DataError
from edgedistill.common.recipe import Recipe, RecipeError, load_recipe
from edgedistill.common.runtime import open_bundle
from edgedistill.common.stage import WALL, Inputs
from edgedistill.common.textstyle import as_served, styled
from edgedistill.distill import labelling, stages, transfer
from edgedistill.distill.augment import normalise
from edgedistill.distill.device import resolve
from edgedistill.distill.finetune import hf_logits, predict_logits
from edgedistill.distill.labelling import SecondPass, check_sample, label_checked, label_shards, labelling_info
from edgedistill.distill.stages import transfer as transfer_stage
from edgedistill.distill.tokenization import encode, load_tokenizer
from edgedistill.distill.transfer_texts import build_texts, leak_filter
from transformers import AutoModelForSequenceClassification

from tests.conftest import PYTHON, ROOT, built_once, run_here, run_module
from tests.distill.bert_init import tiny_bert
from tests.distill.gpt_init import write_gpt2
from tests.distill.test_teacher import kill_9_once, run_stage
from tests.pair_task import pair_recipe, write_pair_task

SMOKE = ROOT / "recipes" / "smoke.yaml"


def test_leak_filter_catches_copies_and_long_overlaps():
    long = "the film is a charming and often affecting journey through grief ."
    leaks = leak_filter(["it 's a charming and often affecting journey .", "bleak", long], "ptb_lower")
    assert leaks("It's a charming and often affecting journey.")
    assert leaks("we said it 's a charming and often affecting journey , sort of")  # whole 7-word sentence inside
    assert leaks("honestly : a charming and often affecting journey through grief , or not")  # 8-word overlap
    assert leaks("bleak !")
    assert not leaks("a charming and often affecting film")
    assert not leaks("bleak and desperate")


def test_leak_filter_catches_a_dev_sentence_however_its_characters_are_encoded():
    leaks = leak_filter(["the café was a charming place to visit ."], "ptb_lower")
    assert leaks("the cafe\u0301 was a charming place to visit .")
    assert leaks("the caf\u200b\u00e9 was a charming place to visit .")


CJK_DEV = ["这部电影很好看", "剧情拖沓演员表演也很生硬", "この映画は本当に面白かった"]  # 7, 12 and 13 characters


@pytest.mark.parametrize(
    "text",
    [
        "说实话这部电影很好看，我推荐。",
        "说实话剧情拖沓演员表演太长了。",
        "友達は「この映画は本当に面白かった」と言った。",
    ],
)
def test_leak_filter_catches_a_chinese_or_japanese_dev_sentence_or_eight_of_its_characters_inside_a_text(text):
    assert leak_filter(CJK_DEV, "raw")(text)


def test_leak_filter_keeps_a_chinese_text_sharing_under_eight_characters_with_a_dev_sentence():
    assert not leak_filter(CJK_DEV, "raw")("剧情拖沓演员的表演很好")


MARKED_UP = ["Tom &amp; Jerry is a fun show", "A fine film.<br /><br />I loved every minute of it"]


@pytest.mark.parametrize("style", ["raw", "ptb_lower"])
@pytest.mark.parametrize("dev", MARKED_UP)
def test_leak_filter_catches_the_styled_copy_of_a_dev_text_with_markup(dev, style):
    assert leak_filter([dev], style)(styled(dev, style))


def task_recipe(tmp_path, train: list[str], dev: list[str], style: str = "ptb_lower", **overrides) -> Recipe:
    """The smoke recipe, unaugmented unless `overrides` say otherwise, on these train and dev texts (labelled 1) and
    one unlabelled sentence (`unlabelled`: these lines instead); `test`: a test split too."""
    splits = {"train": train, "dev": dev} | ({"test": overrides.pop("test")} if "test" in overrides else {})
    for name, texts in splits.items():
        (tmp_path / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{text}\t1\n" for text in texts))
    lines = overrides.pop("unlabelled", ["An unrelated line of unlabelled text."])
    (tmp_path / "u.txt").write_text("".join(f"{line}\n" for line in lines))
    overrides = {
        **{f"data.{name}": str(tmp_path / f"{name}.tsv") for name in splits},
        "transfer.unlabelled_files": [str(tmp_path / "u.txt")],
        "transfer.text_style": style,
        "transfer.n_iter": 0,
        **overrides,
    }
    return load_recipe(SMOKE, overrides)


def built_from(tmp_path, train: list[str], dev: list[str], style: str = "ptb_lower", **overrides):
    """The transfer set of `task_recipe`."""
    return build_texts(task_recipe(tmp_path, train, dev, style, **overrides), "[MASK]")


@pytest.mark.parametrize("style", ["raw", "ptb_lower"])
def test_a_train_text_reaches_the_transfer_set_as_the_server_reads_it(tmp_path, style):
    train = "The broad Standard &amp; Poor 's 500 < .SPX > fell 10.75 points ."
    assert built_from(tmp_path, [train], ["another film"], style).texts[0] == as_served([train], style)[0]


def composition_of(tmp_path, train: list[str], dev: list[str], style: str = "ptb_lower", **overrides) -> dict:
    """The composition of `built_from`'s transfer set."""
    return built_from(tmp_path, train, dev, style, **overrides).composition


def test_max_unlabelled_is_filled_from_a_dump_mostly_of_one_repeated_sentence(tmp_path):
    repeated = ["the very same sentence comes back again and again ."] * 2100
    varied = [f"sentence number {i} of a long and varied dump ." for i in range(900)]
    (tmp_path / "u.txt").write_text("".join(f"{line}\n" for line in repeated + varied))
    overrides = {
        "transfer.unlabelled_files": [str(tmp_path / "u.txt")],
        "transfer.unlabelled_max_lines": 3000,
        "transfer.max_unlabelled": 500,
        "transfer.n_iter": 0,
    }
    assert build_texts(load_recipe(SMOKE, overrides), "[MASK]").composition["unlabelled"] == 500


@pytest.mark.parametrize("style", ["raw", "ptb_lower"])
def test_a_train_text_equal_to_a_dev_text_with_markup_is_dropped_as_a_held_out_overlap(tmp_path, style):
    composition = composition_of(tmp_path, [*MARKED_UP, "a different review of the film"], MARKED_UP, style)
    assert composition["removed_held_out_overlap"] == len(MARKED_UP)


LEAKY = "the harbour lights shimmered over quiet boats while gulls circled the old pier"
CLEAN = ["a dull plot and flat acting sink this film", "an uneven but warm comedy about two brothers"]


def test_a_train_text_overlapping_a_dev_text_is_not_augmented(tmp_path):
    built = built_from(tmp_path, [LEAKY, *CLEAN], [LEAKY], **{"transfer.n_iter": 20, "transfer.p_mask": 0.0})
    augmented = [text for text, source in zip(built.texts, built.sources, strict=True) if source == 2]
    assert not [text for text in augmented if set(text.split()) & set(LEAKY.split())]


def test_the_augmented_copies_of_clean_train_texts_are_kept(tmp_path):
    built = built_from(tmp_path, [LEAKY, *CLEAN], [LEAKY], **{"transfer.n_iter": 20, "transfer.p_mask": 0.0})
    assert built.composition["augmented"] > 0


def test_train_examples_mostly_overlapping_dev_are_warned_of(tmp_path, capsys):
    built_from(tmp_path, [LEAKY, *CLEAN], [LEAKY, CLEAN[0]])
    assert "warning: 2 of 3 train examples share a sentence or 8 words in a row" in capsys.readouterr().out


def test_a_transfer_set_whose_every_train_example_overlaps_dev_is_built_from_the_unlabelled_text(tmp_path):
    built = built_from(tmp_path, [LEAKY, *CLEAN], [LEAKY, *CLEAN])
    assert built.composition["unlabelled"] == 1


def test_few_train_examples_overlapping_dev_are_not_warned_of(tmp_path, capsys):
    built_from(tmp_path, [LEAKY, *CLEAN, "a fourth review that says little", "a fifth, and a short one"], [LEAKY])
    assert "train examples share" not in capsys.readouterr().out


def test_a_train_text_equal_to_a_test_text_is_dropped_as_a_held_out_overlap(tmp_path):
    composition = composition_of(tmp_path, [LEAKY, *CLEAN], ["a dev text"], test=[LEAKY])
    assert composition["removed_held_out_overlap"] == 1


def test_an_unlabelled_sentence_sharing_eight_words_with_a_test_text_is_dropped(tmp_path):
    line = f"Back then {LEAKY}, we thought."
    built = built_from(tmp_path, CLEAN, ["a dev text"], test=[LEAKY], unlabelled=[line, "Another line of text here."])
    assert built.composition["unlabelled"] == 1


def test_an_unlabelled_chinese_sentence_holding_a_dev_sentence_is_dropped(tmp_path):
    line = "说实话剧情拖沓演员表演也很生硬，我不推荐。这部电影的配乐非常出色。"
    built = built_from(tmp_path, CLEAN, ["剧情拖沓演员表演也很生硬"], "raw", unlabelled=[line])
    assert built.composition["removed_held_out_overlap"] == 1


def test_a_train_text_without_letters_or_digits_is_counted_as_having_no_words(tmp_path):
    composition = composition_of(tmp_path, [":-(", "a review of the film", "a review of the film"], ["a dev text"])
    assert composition["removed_no_words"] == 1


def test_a_train_text_without_letters_or_digits_is_no_duplicate(tmp_path):
    composition = composition_of(tmp_path, [":-(", "a review of the film", "a review of the film"], ["a dev text"])
    assert composition["removed_duplicates"] == 1


def test_a_held_out_text_without_letters_or_digits_leaks_no_text_without_them():
    assert not leak_filter(["!!!", "a fine film"], "raw")(":-(")


def test_a_train_text_without_letters_or_digits_is_counted_as_having_no_words_beside_a_dev_text_without_them(tmp_path):
    composition = composition_of(tmp_path, [":-(", "a review of the film"], ["!!!", "a dev text"])
    assert composition["removed_no_words"] == 1


@pytest.mark.parametrize("content, why", [(None, "file not found"), (b"caf\xe9 au lait\n", "not valid UTF-8")])
def test_an_unreadable_unlabelled_file_past_unlabelled_max_lines_is_refused(tmp_path, content, why):
    later = tmp_path / "later.txt"
    if content is not None:
        later.write_bytes(content)
    files = [str(tmp_path / "u.txt"), str(later)]  # u.txt holds the one line the transfer set takes
    with pytest.raises(DataError, match=f"later.txt.*{why}"):
        built_from(
            tmp_path, CLEAN, ["a dev text"], **{"transfer.unlabelled_files": files, "transfer.unlabelled_max_lines": 1}
        )


def test_build_texts_is_deterministic_deduplicated_and_leak_free():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    built = build_texts(recipe, "[MASK]")
    texts, sources, labels, composition = built.texts, built.sources, built.labels, built.composition
    again = build_texts(recipe, "[MASK]")
    assert texts == again.texts
    assert (sources == again.sources).all()
    keys = [normalise(t) for t in texts]
    assert len(set(keys)) == len(keys)
    from edgedistill.common.data import load_splits

    _, dev = load_splits(recipe.data.model_copy(update={"dev_limit": None}))
    assert not set(keys) & {normalise(t) for t in dev.texts}
    counts = np.bincount(sources, minlength=3)
    assert counts.tolist() == [composition["unlabelled"], composition["train"], composition["augmented"]]
    assert composition["unlabelled"] == recipe.transfer.max_unlabelled
    assert (labels[sources == 1] >= 0).all()
    assert (labels[sources != 1] == -1).all()
    assert any("[MASK]" in t for t, s in zip(texts, sources, strict=True) if s == 2)


def test_splitting_and_filtering_the_unlabelled_text_report_progress(monkeypatch, capsys):
    monkeypatch.setenv(settings.PROGRESS_VAR, "lines")
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "0.000001")
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"transfer.unlabelled_max_lines": 20})
    build_texts(recipe, "[MASK]")
    err = capsys.readouterr().err
    assert re.search(r"^\[split\] \d+/20 line", err, re.MULTILINE)
    assert re.search(r"^\[filter\] [\d,]+/[\d,]+ text", err, re.MULTILINE)


def test_splitting_every_unlabelled_line_reports_progress_of_the_file_s_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(settings.PROGRESS_VAR, "lines")
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "0.000001")
    (tmp_path / "u.txt").write_text("A first review here. And its second sentence.\n" * 30)
    overrides = {
        "transfer.unlabelled_files": [str(tmp_path / "u.txt")],
        "transfer.unlabelled_max_lines": None,
        "export.cascades": {},  # which need lines past those the transfer set reads
    }
    build_texts(load_recipe(SMOKE, overrides), "[MASK]")
    assert re.search(r"^\[split\] \d+/30 line", capsys.readouterr().err, re.MULTILINE)


@pytest.mark.parametrize(
    "lines, pairs, need",
    [("ok then\nfine\n", False, "a sentence"), ("one whole sentence here\n", True, "two sentences")],
)
def test_unlabelled_text_that_gives_no_example_is_warned_of(tmp_path, capsys, lines, pairs, need):
    (tmp_path / "u.txt").write_text(lines)
    (tmp_path / "p.tsv").write_text("a\tb\tlabel\nthe first side\tthe second side\t1\n")
    (tmp_path / "d.tsv").write_text("a\tb\tlabel\na dev side\tits other side\t1\n")
    data = {
        "data.train": str(tmp_path / "p.tsv"),
        "data.dev": str(tmp_path / "d.tsv"),
        "data.text_column": "a",
        "data.text_pair_column": "b",
    }
    overrides = {"transfer.unlabelled_files": [str(tmp_path / "u.txt")], **(data if pairs else {})}
    built = build_texts(load_recipe(ROOT / "recipes" / "smoke.yaml", overrides), "[MASK]")
    assert built.composition["unlabelled"] == 0
    assert f"warning: no line of transfer.unlabelled_files holds {need}" in capsys.readouterr().out


def test_a_transfer_set_left_without_texts_is_refused_naming_its_sources(tmp_path):
    (tmp_path / "u.txt").write_text("too short\n")
    overrides = {
        "transfer.unlabelled_files": [str(tmp_path / "u.txt")],
        "transfer.include_train": False,
        "transfer.n_iter": 0,
    }
    with pytest.raises(RecipeError, match=r"transfer set is empty .*transfer\.include_train"):
        build_texts(load_recipe(SMOKE, overrides), "[MASK]")


CPU = resolve(RuntimeConfig(device="cpu", precision="fp32"))


class CountingModel(torch.nn.Module):
    """A stand-in classifier whose logits are a fixed function of the ids, counting its calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, input_ids, attention_mask, **_):
        self.calls += 1
        total = (input_ids * attention_mask).sum(-1, keepdim=True).float()
        return type("Out", (), {"logits": torch.cat([total, -total], -1)})


class WordTokenizer:
    pad_token_id = 0

    def __call__(self, texts, pairs, truncation, max_length, padding):
        return {"input_ids": [[len(w) for w in t.split()][:max_length] for t in texts]}


def test_logit_cache_round_trip_and_resume(tmp_path):
    cfg = TransferConfig(unlabelled_files=["x"], shard_size=3, label_batch_size=2)
    texts = [f"{'a' * i} b" for i in range(1, 9)]
    model = CountingModel()
    first = label_shards(hf_logits(model), WordTokenizer(), texts, None, cfg, tmp_path, CPU)
    assert first.dtype == np.float16
    assert first.shape == (8, 2)
    assert first[:, 0].tolist() == [i + 1 for i in range(1, 9)]
    shards = sorted(tmp_path.glob("logits-*.npy"))
    assert len(shards) == 3
    kept = shards[0].stat().st_mtime_ns
    shards[1].unlink()  # as if killed while writing the second shard
    model.calls = 0
    again = label_shards(hf_logits(model), WordTokenizer(), texts, None, cfg, tmp_path, CPU)
    assert (again == first).all()
    assert model.calls == 2, "only the missing shard (3 texts, batches of 2) is labelled again"
    assert shards[0].stat().st_mtime_ns == kept


@pytest.mark.parametrize("damage", [b"\x93NUMPY garbage", b""], ids=["garbage", "empty"])
def test_a_damaged_shard_is_labelled_again(tmp_path, damage):
    cfg = TransferConfig(unlabelled_files=["x"], shard_size=3, label_batch_size=2)
    texts = [f"{'a' * i} b" for i in range(1, 9)]
    first = label_shards(hf_logits(CountingModel()), WordTokenizer(), texts, None, cfg, tmp_path, CPU)
    (tmp_path / "logits-00001.npy").write_bytes(damage)
    again = label_shards(hf_logits(CountingModel()), WordTokenizer(), texts, None, cfg, tmp_path, CPU)
    assert (again == first).all()


class NearTieModel(torch.nn.Module):
    """Two logits 0.005 apart on sums of a few units: fp32 (and the float16 shards) rank them, bf16 (8 bits of
    mantissa) rounds them equal."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(1, 2)
        with torch.no_grad():
            self.head.weight.fill_(1.0)
            self.head.bias.copy_(torch.tensor([0.0, 5e-3]))

    def forward(self, input_ids, attention_mask, **_):
        total = (input_ids * attention_mask).sum(-1, keepdim=True).float()
        return type("Out", (), {"logits": self.head(total)})


BF16 = resolve(RuntimeConfig(device="cpu", precision="bf16"))
TEXTS = [f"{'a' * i} b" for i in range(1, 9)]


def label_in_bf16(model, tmp_path, recheck: bool, tie_margin: float = 0.0):
    cfg = TransferConfig(unlabelled_files=["x"], shard_size=3, label_batch_size=2, tie_margin=tie_margin)
    return label_checked(model, hf_logits(model), WordTokenizer(), TEXTS, None, cfg, tmp_path, BF16, recheck)


def test_bf16_labels_below_the_agreement_gate_are_made_again_in_fp32(tmp_path):
    logits, figures = label_in_bf16(NearTieModel(), tmp_path, recheck=True)  # no tie margin: every flip counts
    rejected = figures["rejected"]
    assert figures["precision"] == "fp32"
    assert rejected["precision"] == "bf16"
    assert rejected["fp32_check_sentences"] == 8
    assert rejected["fp32_agreement"] == 0.0
    assert rejected["fp32_max_abs_diff"] > 0
    assert (logits.astype(np.float32).argmax(-1) == 1).all(), "the fp32 labels rank the two logits"


def test_explicit_bf16_labels_are_kept_with_their_agreement(tmp_path):
    logits, figures = label_in_bf16(NearTieModel(), tmp_path, recheck=False)
    assert figures["precision"] == "bf16"
    assert figures["fp32_agreement"] == 0.0
    assert "rejected" not in figures
    assert (logits.astype(np.float32).argmax(-1) == 0).all(), "bf16 rounds the two logits to a tie"


def test_int8_labels_below_the_gate_are_made_again_in_fp32_whatever_the_precision_setting(tmp_path):
    teacher = NearTieModel()  # fp32 ranks class 1 first
    wrong = hf_logits(NearTieModel())

    def int8(batch):  # a labeller sure of the other class: above any margin, so its second pass keeps it
        return wrong(batch).flip(-1) * 100

    cfg = TransferConfig(unlabelled_files=["x"], shard_size=3, label_batch_size=2, tie_margin=0.0)
    second_pass = SecondPass(hf_logits(teacher), 0.5, 0, 2, CPU)
    logits, figures = label_checked(teacher, int8, WordTokenizer(), TEXTS, None, cfg, tmp_path, CPU, False, second_pass)
    assert figures["precision"] == "fp32"
    assert figures["rejected"]["fp32_agreement"] == 0.0
    assert (logits.astype(np.float32).argmax(-1) == 1).all(), "the fp32 labels"


def test_flips_of_near_ties_are_counted_but_do_not_fail_the_gate(tmp_path):
    logits, figures = label_in_bf16(NearTieModel(), tmp_path, recheck=True, tie_margin=0.1)
    assert figures["precision"] == "bf16"
    assert "rejected" not in figures
    assert figures["fp32_agreement"] == 0.0
    assert figures["fp32_tie_flips"] == 8
    assert figures["fp32_agreement_beyond_ties"] == 1.0


def test_bf16_labels_within_the_agreement_gate_are_kept(tmp_path):
    _, figures = label_in_bf16(CountingModel(), tmp_path, recheck=True)
    assert figures["precision"] == "bf16"
    assert figures["fp32_agreement"] == 1.0
    assert "rejected" not in figures


def test_fp32_labels_are_not_checked(tmp_path):
    cfg = TransferConfig(unlabelled_files=["x"])
    model = CountingModel()
    _, figures = label_checked(model, hf_logits(model), WordTokenizer(), TEXTS, None, cfg, tmp_path, CPU, True)
    assert figures == {"precision": "fp32"}


def test_the_second_pass_labels_again_only_the_texts_below_its_margin():
    model = CountingModel()  # the teacher: logits (total, -total) of the ids
    first = np.array([[0.25, 0.0], [0.0, 3.0], [0.5, 0.0]], dtype=np.float32)
    second = SecondPass(hf_logits(model), 1.0, 0, 2, CPU)
    made, relabelled = second.relabel({"input_ids": [[1], [2, 3], [9]]}, first)
    assert made.tolist() == [[1.0, -1.0], [0.0, 3.0], [9.0, -9.0]]
    assert relabelled == 2
    assert model.calls == 1, "the two unsure texts go to the teacher as one batch"
    assert first[0].tolist() == [0.25, 0.0], "the labeller's logits are not changed in place"


def test_the_second_pass_labels_again_a_row_of_nan_logits():
    second = SecondPass(hf_logits(CountingModel()), 1.0, 0, 2, CPU)
    made, _ = second.relabel({"input_ids": [[2], [9]]}, np.array([[np.nan, 0.0], [9.0, -9.0]]))
    assert made[0].tolist() == [2.0, -2.0]


def unsure_labeller(model):
    """An INT8 labeller's stand-in: the teacher's logits, but the wrong label at a margin of 0.2 for texts whose
    ids sum below 5."""

    def forward(batch):
        logits = hf_logits(model)(batch)
        unsure = (batch["input_ids"] * batch["attention_mask"]).sum(-1) < 5
        logits[unsure] = torch.tensor([-0.1, 0.1])
        return logits

    return forward


def label_with_second_pass(tmp_path, margin: float):
    cfg = TransferConfig(unlabelled_files=["x"], shard_size=3, label_batch_size=2)
    model = CountingModel()
    second = SecondPass(hf_logits(model), margin, 0, 2, CPU)
    forward = unsure_labeller(model)
    return label_checked(model, forward, WordTokenizer(), TEXTS, None, cfg, tmp_path, CPU, True, second)


def label_shards_with_second_pass(tmp_path, model):
    cfg = TransferConfig(unlabelled_files=["x"], shard_size=3, label_batch_size=2)
    second = SecondPass(hf_logits(model), 1.0, 0, 2, CPU)
    label_shards(unsure_labeller(model), WordTokenizer(), TEXTS, None, cfg, tmp_path, CPU, second)
    return second.figures()


def test_the_second_pass_figures_of_a_rerun_count_the_shards_it_kept(tmp_path):
    first = label_shards_with_second_pass(tmp_path, CountingModel())
    again = label_shards_with_second_pass(tmp_path, CountingModel())
    assert again == first


def test_a_shard_without_its_second_pass_counts_is_labelled_again(tmp_path, capsys):
    label_shards_with_second_pass(tmp_path, CountingModel())
    (tmp_path / "logits-00001.json").unlink()  # as if killed between writing the shard and its counts
    label_shards_with_second_pass(tmp_path, CountingModel())
    assert "resuming labelling: 5 of 8 sentences already labelled" in capsys.readouterr().out


def test_labels_with_a_second_pass_are_checked_against_fp32(tmp_path):
    logits, figures = label_with_second_pass(tmp_path, margin=1.0)
    assert figures["second_pass"] == {
        "margin": 1.0,
        "precision": "fp32",
        "texts": 8,
        "relabelled": 3,
        "relabelled_share": 0.375,
    }
    assert figures["fp32_check_sentences"] == 8
    assert figures["fp32_agreement"] == 1.0
    assert (logits.astype(np.float32).argmax(-1) == 0).all()


def test_labels_with_too_narrow_a_margin_are_made_again_by_the_teacher(tmp_path):
    logits, figures = label_with_second_pass(tmp_path, margin=0.1)
    assert figures["precision"] == "fp32"
    assert figures["engine"] == "pytorch"
    assert figures["rejected"]["fp32_agreement"] == 5 / 8
    assert figures["rejected"]["second_pass"]["relabelled"] == 0
    assert (logits.astype(np.float32).argmax(-1) == 0).all(), "the teacher's labels replace the labeller's"


INT8_LABELLER = {
    "engine": "onnxruntime",
    "bundle": "runs/x/bundle-teacher-int8",
    "bundle_precision": "int8",
    "bundle_sha256": "ab12",
    "agreement": 0.99,
    "max_abs_diff": 0.3,
    "dev_accuracy": 0.9,
}


def test_a_rejected_labellers_bundle_is_not_named_at_the_top_of_the_labelling_record(tmp_path):
    _, made = label_with_second_pass(tmp_path, margin=0.1)
    assert "bundle_sha256" not in labelling_info(CPU, INT8_LABELLER, made)


def test_a_rejected_labellers_bundle_is_named_under_rejected(tmp_path):
    _, made = label_with_second_pass(tmp_path, margin=0.1)
    assert labelling_info(CPU, INT8_LABELLER, made)["rejected"]["bundle_sha256"] == "ab12"


def test_an_accepted_labellers_bundle_is_named_at_the_top_of_the_labelling_record(tmp_path):
    _, made = label_with_second_pass(tmp_path, margin=1.0)
    assert labelling_info(CPU, INT8_LABELLER, made)["bundle_sha256"] == "ab12"


def dev_logits_of(folder: Path, teacher: Path, dev: list[str]) -> np.ndarray:
    """The dev logits the transfer stage, run in `folder` on the CPU in fp32, writes for these dev texts of a
    `task_recipe` (`ptb_lower`) labelled by `teacher`."""
    folder.mkdir()
    recipe = task_recipe(folder, CLEAN, dev, **{"runtime.device": "cpu", "runtime.precision": "fp32"})
    inputs = Inputs(recipe, "hash", folder / "work", False, {}, {"teacher": teacher}, "key", folder / "transfer")
    transfer.build_stage(inputs).write(folder)
    return np.load(folder / "dev_logits.npy")


def test_the_teachers_dev_logits_are_of_the_dev_texts_as_the_bundles_serve_them(tmp_path):
    teacher = tiny_bert(tmp_path / "teacher", 2)
    cased = ["Don't waste your money on it!", "It's a charming, often affecting journey."]
    served = dev_logits_of(tmp_path / "served", teacher, as_served(cased, "ptb_lower"))
    np.testing.assert_array_equal(dev_logits_of(tmp_path / "cased", teacher, cased), served)


def test_transfer_stage_writes_fp16_logits_for_every_text_and_the_dev_split(smoke_run):
    manifest = mf.load(smoke_run / "transfer")
    texts = (smoke_run / "transfer" / "texts.txt").read_text().splitlines()
    logits = np.load(smoke_run / "transfer" / "logits.npy")
    assert logits.shape == (len(texts), 2)
    assert logits.dtype == np.float16
    assert manifest.metrics["sentences"] == len(texts)
    assert manifest.parents["teacher"].manifest_sha256 == mf.sha256_file(smoke_run / "teacher" / "manifest.json")
    assert np.load(smoke_run / "transfer" / "dev_logits.npy").shape == (300, 2)


# A teacher of a few steps, and a transfer set of some 3,000 texts (1,000 train examples, 1,000 unlabelled sentences,
# 1,000 augmented copies; the smoke recipe's holds some 9,000) in shards of 100: a run killed at its first shard has
# tens of shards still to label.
SMALL = ["--pretrain.optim.max_steps=10", "--finetune.optim.max_steps=10", "--transfer.shard_size=100"]
SMALL += ["--data.train_limit=1000", "--transfer.max_unlabelled=1000", "--transfer.max_augmented=1000"]


def overridden(args: list[str], *changes: str) -> list[str]:
    """The overrides `args` with `changes` in place of those of the same keys (a key may be given once)."""
    changed = {change.partition("=")[0] for change in changes}
    return [arg for arg in args if arg.partition("=")[0] not in changed] + list(changes)


@pytest.fixture
def straight(tmp_path_factory) -> Path:
    """This test's runs folder, holding the run `straight`: the smoke recipe's teacher and transfer set with `SMALL`
    settings, built once for the test run."""

    def build(folder: Path) -> None:
        for stage in ("teacher", "transfer"):
            built = run_stage(stage, SMOKE, "--name=straight", *SMALL, env_extra={"EDGEDISTILL_RUNS_DIR": str(folder)})
            assert built.returncode == 0, built.stderr[-3000:]

    runs = Path(os.environ["EDGEDISTILL_RUNS_DIR"])
    shutil.copytree(built_once(tmp_path_factory, "small-transfer", build) / "straight", runs / "straight")
    return runs


@pytest.mark.slow
def test_a_forced_transfer_killed_and_forced_again_goes_on_from_its_label_shards(straight):
    """`transfer --force` starts afresh once: the same forced command, run again after a kill, keeps its shards."""
    work = straight / "straight" / ".work" / "transfer"
    args = ["transfer", SMOKE, "--name=straight", *SMALL, "--force"]
    kill_9_once(args, lambda: any(work.glob("logits-*.npy")))
    again = run_stage(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[transfer] resuming labelling" in again.stdout


def killed_while_labelling(runs: Path, name: str, *extra: str) -> Path:
    """The transfer work folder of run `name` in `runs` (with the settings `extra`), killed once its first label shard
    was written, beside the run `straight` (the `straight` fixture's), built whole from the same teacher."""
    (runs / name).mkdir()
    os.symlink(runs / "straight" / "teacher", runs / name / "teacher")
    work = runs / name / ".work" / "transfer"
    kill_9_once(["transfer", SMOKE, f"--name={name}", *SMALL, *extra], lambda: any(work.glob("logits-*.npy")))
    return work


@pytest.mark.slow
def test_a_transfer_killed_while_labelling_resumes_from_its_kept_texts_to_the_same_logits(straight, monkeypatch):
    """A rerun after a kill labels the texts the killed run built (it is refused `build_texts`), to the logits of an
    uninterrupted run."""
    runs = straight
    killed_while_labelling(runs, "killed")

    def refuse(*args, **kwargs):
        raise AssertionError("build_texts ran again")

    monkeypatch.setattr(transfer, "build_texts", refuse)
    resumed = run_stage("transfer", SMOKE, "--name=killed", *SMALL)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logits = np.load(runs / "killed" / "transfer" / "logits.npy")
    np.testing.assert_array_equal(logits, np.load(runs / "straight" / "transfer" / "logits.npy"))


@pytest.mark.slow
def test_a_transfer_killed_while_labelling_resumed_in_another_precision_keeps_its_texts_not_its_labels(
    straight, monkeypatch
):
    """Labels of another precision are made again; the texts, of the same work, are not built again. Killed in bf16,
    resumed in fp32: the CPU emulates bf16, slowly, and the shards go by the precision either way."""
    killed_while_labelling(straight, "other", "--runtime.precision=bf16")

    def refuse(*args, **kwargs):
        raise AssertionError("build_texts ran again")

    monkeypatch.setattr(transfer, "build_texts", refuse)
    resumed = run_stage("transfer", SMOKE, "--name=other", *SMALL, "--runtime.precision=fp32")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming labelling" not in resumed.stdout


@pytest.mark.slow
def test_label_shards_an_earlier_release_left_without_kept_texts_are_labelled_again(straight):
    """Shards of a killed run whose work folder keeps no texts (an earlier release's) may be of texts built otherwise:
    they are not taken (one is spoilt here, which a run taking it would give back)."""
    runs = straight
    work = killed_while_labelling(runs, "earlier")
    shutil.rmtree(work / "texts")
    shard = next(work.glob("logits-*.npy"))
    np.save(shard, np.zeros_like(np.load(shard)))
    resumed = run_stage("transfer", SMOKE, "--name=earlier", *SMALL)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logits = np.load(runs / "earlier" / "transfer" / "logits.npy")
    np.testing.assert_array_equal(logits, np.load(runs / "straight" / "transfer" / "logits.npy"))


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def stopped_before_labelling(runs: Path, name: str, *extra: str) -> Path:
    """The transfer work folder of run `name` in `runs` (with the settings `extra`, in place of `SMALL`'s), stopped as
    by Ctrl-C once its texts were kept, before labelling, beside the run `straight` (the `straight` fixture's), from the
    same teacher."""
    (runs / name).mkdir(exist_ok=True)
    if not (runs / name / "teacher").exists():
        os.symlink(runs / "straight" / "teacher", runs / name / "teacher")
    with pytest.MonkeyPatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(transfer, "label_checked", interrupt)
        run_stage("transfer", SMOKE, f"--name={name}", *overridden(SMALL, *extra))
    return runs / name / ".work" / "transfer"


def texts_built_when_resumed(runs: Path, monkeypatch, *extra: str) -> int:
    """How many times `build_texts` ran in run `texts` stopped before labelling, then run again with the settings
    `extra` until it labels."""
    stopped_before_labelling(runs, "texts")
    built = []
    monkeypatch.setattr(transfer, "build_texts", lambda *args: built.append(args) or build_texts(*args))
    stopped_before_labelling(runs, "texts", *extra)
    return len(built)


@pytest.mark.slow
@pytest.mark.parametrize(
    "setting", ["--transfer.label_batch_size=64", "--transfer.shard_size=50", "--transfer.min_agreement=0.99"]
)
def test_texts_kept_by_a_stopped_transfer_are_not_built_again_after_a_labelling_setting_changed(
    straight, monkeypatch, setting
):
    assert texts_built_when_resumed(straight, monkeypatch, setting) == 0


@pytest.mark.slow
def test_texts_kept_by_a_stopped_transfer_are_built_again_after_a_setting_that_shapes_them_changed(
    straight, monkeypatch
):
    assert texts_built_when_resumed(straight, monkeypatch, "--transfer.seed=14") == 1


@pytest.mark.slow
def test_the_wall_time_of_a_stopped_transfer_counts_when_another_precision_labels_its_kept_texts(straight):
    """Stopped in bf16 (an hour of it, as kept), labelled in fp32: the manifest's wall time holds the hour."""
    wall = stopped_before_labelling(straight, "wall", "--runtime.precision=bf16") / WALL
    wall.write_text(json.dumps(json.loads(wall.read_text()) | {"seconds": 3600.0}))
    resumed = run_stage("transfer", SMOKE, "--name=wall", *SMALL, "--runtime.precision=fp32")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert mf.load(straight / "wall" / "transfer").metrics["wall_seconds"] >= 3600


def transfer_with_labeller(runs, name: str, *extra: str) -> subprocess.CompletedProcess:
    """`python -m distill transfer` of the smoke recipe as run `name`, labelled by the teacher-fused bundle unless
    `extra` names another."""
    labelled = overridden(["--transfer.labeller=teacher-fused"], *extra)
    return run_module("distill", runs, "transfer", SMOKE, f"--name={name}", *labelled)


def fp32_teacher_logits(run) -> np.ndarray:
    """The teacher of `run` in PyTorch, fp32, on its transfer set's texts (the smoke run's own labels may be bf16)."""
    tokenizer = load_tokenizer(str(run / "teacher"))
    model = AutoModelForSequenceClassification.from_pretrained(run / "teacher").eval()
    texts = (run / "transfer" / "texts.txt").read_text().splitlines()
    features = encode(tokenizer, texts, None, load_recipe(SMOKE).transfer.max_length)
    with torch.inference_mode():
        return predict_logits(hf_logits(model), features, tokenizer.pad_token_id)


def test_onnx_labelling_agrees_with_pytorch_within_the_gate(smoke_bundles):
    run = smoke_bundles.parent / "onnx-labels"
    run.mkdir()
    for folder in ("teacher", "bundle-teacher-fused"):
        (run / folder).symlink_to(smoke_bundles / folder)
    result = transfer_with_labeller(smoke_bundles.parent, run.name, "--runtime.device=cpu", "--runtime.precision=bf16")
    assert result.returncode == 0, result.stderr[-3000:]
    labelling = mf.load(run / "transfer").info["labelling"]
    assert labelling["engine"] == "onnxruntime"
    assert labelling["agreement"] >= 0.999
    assert labelling["precision"] == "fp32", "an fp32 graph labels in fp32, whatever runtime.precision says"
    assert labelling["bundle_sha256"] == mf.sha256_file(run / "bundle-teacher-fused" / mf.MANIFEST)
    by_onnx = np.load(run / "transfer" / "logits.npy").astype(np.float32)
    by_torch = fp32_teacher_logits(run)
    assert (by_onnx.argmax(-1) == by_torch.argmax(-1)).mean() >= 0.999
    assert np.abs(by_onnx - by_torch).max() < 0.05  # float16 storage of logits of a few units


def test_int8_labelling_with_its_second_pass_agrees_with_pytorch_within_the_gate(smoke_bundles):
    run = smoke_bundles.parent / "int8-labels"
    run.mkdir()
    for folder in ("teacher", "bundle-teacher-int8"):
        (run / folder).symlink_to(smoke_bundles / folder)
    second_pass = ("--transfer.labeller=teacher-int8", "--transfer.relabel_margin=1.0", "--runtime.precision=fp32")
    result = transfer_with_labeller(smoke_bundles.parent, run.name, "--runtime.device=cpu", *second_pass)
    assert result.returncode == 0, result.stderr[-3000:]
    labelling = mf.load(run / "transfer").info["labelling"]
    texts = (run / "transfer" / "texts.txt").read_text().splitlines()
    assert labelling["engine"] == "onnxruntime"
    assert labelling["bundle_precision"] == "int8"
    assert labelling["second_pass"]["texts"] == len(texts)
    assert labelling["fp32_agreement"] >= 0.999
    assert labelling["second_pass"]["dev_agreement"] >= 0.99
    by_int8 = np.load(run / "transfer" / "logits.npy").astype(np.float32)
    assert (by_int8.argmax(-1) == fp32_teacher_logits(run).argmax(-1)).mean() >= 0.999


def rebuilt(bundle: Path) -> None:
    """`bundle` published again with the same files, as building it again does: a new manifest."""
    republished = mf.load(bundle).model_copy(update={"created": "2030-01-01T00:00:00+00:00"})
    (bundle / mf.MANIFEST).write_text(republished.model_dump_json(indent=2))


def labelled_by_a_copy_of_teacher_fused(smoke_bundles: Path, name: str) -> Path:
    """Run `name` of the smoke recipe, beside the smoke run: its teacher, a copy of its bundle teacher-fused, and a
    transfer set that copy labelled."""
    run = smoke_bundles.parent / name
    run.mkdir()
    (run / "teacher").symlink_to(smoke_bundles / "teacher")
    shutil.copytree(smoke_bundles / "bundle-teacher-fused", run / "bundle-teacher-fused")
    result = transfer_with_labeller(smoke_bundles.parent, run.name, "--runtime.device=cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def test_a_transfer_set_whose_labeller_bundle_was_built_again_is_stale_naming_it(smoke_bundles, monkeypatch):
    run = labelled_by_a_copy_of_teacher_fused(smoke_bundles, "labeller-built-again")
    rebuilt(run / "bundle-teacher-fused")
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    recipe = load_recipe(SMOKE, {"name": run.name, "transfer.labeller": "teacher-fused"})
    assert transfer_stage(recipe).staleness() == "its parent bundle-teacher-fused was built again"


@pytest.fixture(scope="module")
def earlier_release_run(smoke_bundles) -> Path:
    """A run of the smoke recipe whose transfer set teacher-fused labelled, its manifest as a release before the
    labeller was recorded among the parents wrote it: the bundle in `info.labelling` alone."""
    run = labelled_by_a_copy_of_teacher_fused(smoke_bundles, "earlier-release-labelled")
    manifest = mf.load(run / "transfer")
    earlier = manifest.model_copy(update={"parents": {"teacher": manifest.parents["teacher"]}})
    (run / "transfer" / mf.MANIFEST).write_text(earlier.model_dump_json(indent=2))
    return run


def copy_of(run: Path, name: str) -> Path:
    """A copy of the run folder `run` beside it, as run `name`."""
    shutil.copytree(run, run.parent / name, symlinks=True)
    return run.parent / name


def fused_transfer_staleness(monkeypatch, run: Path) -> str | None:
    """Why the transfer set of `run`, of the smoke recipe labelled by teacher-fused, must be built again."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(run.parent))
    return transfer_stage(load_recipe(SMOKE, {"name": run.name, "transfer.labeller": "teacher-fused"})).staleness()


def test_a_transfer_set_of_an_earlier_release_whose_labeller_was_built_again_is_stale_saying_what_to_run(
    earlier_release_run, monkeypatch
):
    run = copy_of(earlier_release_run, "earlier-release-labeller-built-again")
    rebuilt(run / "bundle-teacher-fused")
    assert fused_transfer_staleness(monkeypatch, run) == (
        "its labeller bundle-teacher-fused was built again since it labelled the set (info.labelling.bundle_sha256; "
        "an earlier release did not record the labeller among the parents): `edgedistill transfer RECIPE` labels it "
        "again"
    )


def test_a_transfer_set_of_an_earlier_release_whose_labeller_is_gone_is_stale_naming_it(
    earlier_release_run, monkeypatch
):
    run = copy_of(earlier_release_run, "earlier-release-labeller-gone")
    shutil.rmtree(run / "bundle-teacher-fused")
    assert fused_transfer_staleness(monkeypatch, run).startswith("its labeller bundle-teacher-fused is gone")


def test_a_transfer_set_of_an_earlier_release_labelled_by_the_bundle_now_there_is_current(
    earlier_release_run, monkeypatch
):
    run = copy_of(earlier_release_run, "earlier-release-labeller-as-it-was")
    assert fused_transfer_staleness(monkeypatch, run) is None


def test_a_transfer_set_of_an_earlier_release_that_pytorch_labelled_stays_current_when_the_labeller_is_built_again(
    earlier_release_run, monkeypatch
):
    """Labels the gate rejected and PyTorch made again, as a release before they moved under `rejected` recorded them:
    the bundle at the top of `info.labelling`, the engine PyTorch."""
    run = copy_of(earlier_release_run, "earlier-release-pytorch-labelled")
    manifest = mf.load(run / "transfer")
    labelling = manifest.info["labelling"] | {"engine": "pytorch", "precision": "fp32"}
    relabelled = manifest.model_copy(update={"info": manifest.info | {"labelling": labelling}})
    (run / "transfer" / mf.MANIFEST).write_text(relabelled.model_dump_json(indent=2))
    rebuilt(run / "bundle-teacher-fused")
    assert fused_transfer_staleness(monkeypatch, run) is None


def transfer_here(monkeypatch, runs, name: str, *extra: str) -> subprocess.CompletedProcess:
    """`transfer_with_labeller` run in this process, for a labeller that is refused before any labelling."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(runs))
    return run_here(
        "distill", "transfer", SMOKE, f"--name={name}", *overridden(["--transfer.labeller=teacher-fused"], *extra)
    )


def test_a_labeller_bundle_of_another_precision_than_the_recipe_says_is_refused(smoke_bundles, monkeypatch):
    run = smoke_bundles.parent / "stale-labeller"
    run.mkdir()
    (run / "teacher").symlink_to(smoke_bundles / "teacher")
    (run / "bundle-teacher-int8").symlink_to(smoke_bundles / "bundle-teacher-fused")
    int8 = ("--transfer.labeller=teacher-int8", "--transfer.relabel_margin=1.0")
    result = transfer_here(monkeypatch, smoke_bundles.parent, run.name, "--runtime.device=cpu", *int8)
    assert result.returncode == 2
    assert "is a fp32 bundle but the recipe makes it int8" in result.stderr


def test_a_labeller_built_from_other_export_settings_is_refused_naming_the_setting(smoke_bundles, monkeypatch):
    run = smoke_bundles.parent / "relabelled"
    run.mkdir()
    for folder in ("teacher", "bundle-teacher-int8"):
        (run / folder).symlink_to(smoke_bundles / folder)
    int8 = ("--transfer.labeller=teacher-int8", "--transfer.relabel_margin=1.0")
    changed = "--export.bundles.teacher-int8.per_channel=true"
    result = transfer_here(monkeypatch, smoke_bundles.parent, run.name, "--runtime.device=cpu", *int8, changed)
    assert result.returncode == 2
    assert "export.bundles.teacher-int8.per_channel false -> true" in result.stderr
    assert "run `edgedistill labeller RECIPE` first" in result.stderr


def test_a_labeller_recording_a_setting_recipes_no_longer_have_is_refused_naming_it(smoke_bundles, monkeypatch):
    run = smoke_bundles.parent / "older-labeller"
    (run / "teacher").parent.mkdir()
    (run / "teacher").symlink_to(smoke_bundles / "teacher")
    shutil.copytree(smoke_bundles / "bundle-teacher-int8", run / "bundle-teacher-int8")
    manifest = run / "bundle-teacher-int8" / "manifest.json"
    record = json.loads(manifest.read_text())
    record["hashed"]["settings"]["export.dropped_setting"] = 1
    manifest.write_text(json.dumps(record))
    int8 = ("--transfer.labeller=teacher-int8", "--transfer.relabel_margin=1.0")
    result = transfer_here(monkeypatch, smoke_bundles.parent, run.name, "--runtime.device=cpu", *int8)
    assert "records a setting recipes no longer have (export.dropped_setting: the recipe has no such setting)" in (
        result.stderr
    )


def test_a_labeller_exported_from_another_teacher_is_refused(smoke_bundles, monkeypatch):
    run = smoke_bundles.parent / "other-teacher"
    shutil.copytree(smoke_bundles / "teacher", run / "teacher")
    manifest = run / "teacher" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"recipe": "smoke"', '"recipe": "retrained"'))
    (run / "bundle-teacher-fused").symlink_to(smoke_bundles / "bundle-teacher-fused")
    result = transfer_here(monkeypatch, smoke_bundles.parent, run.name)
    assert result.returncode == 2
    assert "was not exported from the teacher" in result.stderr


def test_a_missing_labeller_names_the_command_that_builds_it(smoke_run, monkeypatch):
    run = smoke_run.parent / "no-labeller"
    run.mkdir()
    (run / "teacher").symlink_to(smoke_run / "teacher")
    result = transfer_here(monkeypatch, smoke_run.parent, run.name, "--runtime.device=cpu")
    assert result.returncode == 2
    assert "edgedistill labeller RECIPE" in result.stderr


def test_the_check_sample_is_spread_evenly_from_first_to_last_text():
    assert check_sample(10, 4).tolist() == [0, 3, 6, 9]


def test_the_check_sample_takes_every_text_of_a_small_set():
    assert check_sample(3, 5).tolist() == [0, 1, 2]


def wrong_on_the_last_text(model):
    """A labeller's stand-in: the teacher's logits, but the other label by a wide margin for the last of TEXTS."""

    def forward(batch):
        logits = hf_logits(model)(batch)
        logits[(batch["input_ids"] * batch["attention_mask"]).sum(-1) == 9] = torch.tensor([-5.0, 5.0])
        return logits

    return forward


def test_the_fp32_check_sees_the_end_of_the_set_not_only_its_first_texts(tmp_path):
    cfg = TransferConfig(unlabelled_files=["x"], shard_size=3, label_batch_size=2, precision_check_sentences=3)
    model = CountingModel()
    second = SecondPass(hf_logits(model), 0.1, 0, 2, CPU)
    forward = wrong_on_the_last_text(model)
    _, figures = label_checked(model, forward, WordTokenizer(), TEXTS, None, cfg, tmp_path, CPU, True, second)
    assert figures["rejected"]["fp32_check_sentences"] == 3
    assert figures["rejected"]["fp32_agreement_beyond_ties"] == pytest.approx(2 / 3)


def test_the_transfer_stage_under_torchrun_is_refused():
    # each rank would label the whole set into the same shards and publish it
    torchrun = Path(PYTHON).with_name("torchrun")
    cmd = [torchrun, "--standalone", "--nproc_per_node=2", "-m", "distill", "transfer", ROOT / "recipes" / "smoke.yaml"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "the transfer set is labelled in one process" in result.stderr


def test_the_labeller_bundles_export_settings_make_the_transfer_set_stale():
    fused = {"transfer.labeller": "teacher-fused"}
    before = transfer_stage(load_recipe(SMOKE, fused)).config_hash
    after = transfer_stage(load_recipe(SMOKE, fused | {"export.bundles.teacher-fused.skip_layer_norm": False}))
    assert after.config_hash != before


def test_a_transfer_set_built_holding_out_other_texts_is_stale_saying_so(smoke_run, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_run.parent))
    monkeypatch.setattr(stages, "HELD_OUT", "dev only, after augmenting")
    assert transfer_stage(load_recipe(SMOKE)).staleness() == (
        'held_out "dev and test, before augmenting" -> "dev only, after augmenting"'
    )


def test_the_labeller_runs_the_model_it_verified_not_a_file_swapped_in_since(swapped_after_check, smoke_bundles):
    folder = swapped_after_check(labelling)
    forward, _ = labelling.onnx_labeller(folder, smoke_bundles / "teacher", max_batch=8)
    ids = torch.tensor([[1, 5, 7, 2]])
    assert forward({"input_ids": ids, "attention_mask": torch.ones_like(ids)}).shape == (1, 2)


def test_the_labeller_opens_its_bundle_for_batches_of_the_labelling_batch_size(monkeypatch, smoke_bundles):
    asked = []

    def recording(*args, **kwargs):
        asked.append(kwargs["max_batch"])
        return open_bundle(*args, **kwargs)

    monkeypatch.setattr(labelling, "open_bundle", recording)
    labelling.onnx_labeller(smoke_bundles / "bundle-teacher-fused", smoke_bundles / "teacher", max_batch=200)
    assert asked == [200]


@pytest.fixture(scope="module")
def gpt2_teacher(tmp_path_factory) -> tuple[Path, list[str]]:
    """A runs folder holding the smoke recipe's teacher fine-tuned for two steps from a GPT-2 checkpoint of 32
    positions (whose tokenizer pads with its unknown token, `<|endoftext|>`), and the arguments that built it."""
    folder = tmp_path_factory.mktemp("gpt2-teacher")
    reviews = Path(settings.defaults()["EDGEDISTILL_DATA_DIR"]) / "unlabeled" / "movie_reviews.txt"
    init = write_gpt2(folder / "gpt2-short", reviews.read_text().splitlines()[:300], positions=32)
    args = [str(SMOKE), "--model.family=gpt", "--distill.students.transformer.init_from_teacher=false"]
    args += [f"--model.init={init}", "--pretrain=null", "--model.max_length=32"]
    args += ["--finetune.optim.max_steps=2", "--data.train_limit=100", "--data.dev_limit=50"]
    assert run_module("distill", folder / "runs", "teacher", *args).returncode == 0
    return folder / "runs", args


def test_a_transfer_max_length_past_the_teachers_positions_is_refused_before_labelling(gpt2_teacher):
    runs, args = gpt2_teacher
    result = run_module("distill", runs, "transfer", *args, "--transfer.max_length=48", "--transfer.p_mask=0")
    assert "transfer.max_length=48, but" in result.stderr and "has 32 positions" in result.stderr


# Fewer texts to label than the smoke recipe's, within the teacher's 32 positions.
SMALL_TRANSFER = ["--transfer.max_length=32", "--transfer.max_unlabelled=50", "--transfer.max_augmented=50"]


def test_masking_with_a_tokenizer_whose_unknown_token_pads_is_refused_naming_transfer_p_mask(gpt2_teacher):
    runs, args = gpt2_teacher
    result = run_module("distill", runs, "transfer", *args, *SMALL_TRANSFER, "--transfer.p_mask=0.1")
    assert "which is also its pad token, so a masked word would be read as padding; set transfer.p_mask to 0" in (
        result.stderr
    )


def test_masking_with_a_tokenizer_whose_unknown_token_pads_is_warned_of_before_the_teacher_trains(
    gpt2_teacher, tmp_path
):
    runs, args = gpt2_teacher
    # one step more than the teacher took: it trains again, in a copy so the module's teacher stays as built
    shutil.copytree(runs, tmp_path / "runs")
    more = overridden(args, "--transfer.p_mask=0.1", "--finetune.optim.max_steps=3")
    result = run_module("distill", tmp_path / "runs", "finetune", *more)
    assert "[teacher] warning: " in result.stdout and "set transfer.p_mask to 0" in result.stdout


def test_a_tokenizer_whose_unknown_token_pads_is_accepted_without_masking(gpt2_teacher):
    runs, args = gpt2_teacher
    assert run_module("distill", runs, "transfer", *args, *SMALL_TRANSFER, "--transfer.p_mask=0").returncode == 0


def test_pairs_that_transfer_max_length_cuts_are_warned_of_by_the_transfer_stage(tmp_path):
    paths = write_pair_task(tmp_path / "data", train=200, dev=50, unlabelled=300)
    recipe = tmp_path / "pairs.yaml"
    recipe.write_text(pair_recipe(paths))
    args = [str(recipe), "--pretrain.optim.max_steps=1", "--finetune.optim.max_steps=1"]
    args += ["--transfer.max_length=8", "--transfer.max_unlabelled=50", "--transfer.max_augmented=50"]
    runs = tmp_path / "runs"
    assert run_module("distill", runs, "teacher", *args).returncode == 0
    result = run_module("distill", runs, "transfer", *args)
    assert (
        "[transfer] warning: 100% of the train and dev pairs reach it with both texts (transfer.max_length=8 tokens)"
        in result.stdout
    )


def test_a_labeller_not_built_names_overrides_that_label_the_default_recipe_in_pytorch(tmp_path):
    with pytest.raises(mf.ArtifactError) as refused:
        labelling.onnx_labeller(tmp_path / "bundle-teacher-int8", tmp_path / "teacher", max_batch=8)
    overrides = dict(re.findall(r"--([\w.]+)=(null)", str(refused.value)))
    assert load_recipe(ROOT / "recipes" / "sst2.yaml", dict.fromkeys(overrides)).transfer.labeller is None


@pytest.mark.parametrize("train", MARKED_UP)
def test_a_raw_train_text_equal_to_a_dev_text_but_for_its_markup_is_dropped_as_a_held_out_overlap(tmp_path, train):
    dev = styled(train, "raw")
    assert (
        built_from(tmp_path, [train, "a different review of the film"], [dev], "raw").composition[
            "removed_held_out_overlap"
        ]
        == 1
    )


def test_a_raw_train_text_holding_a_line_break_reaches_the_transfer_set_on_one_line(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"sentence": "a fine film\\nthat I loved", "label": 1}\n')
    recipe = task_recipe(tmp_path, ["unused"], ["another film"], "raw", **{"data.train": str(tmp_path / "train.jsonl")})
    assert build_texts(recipe, "[MASK]").texts[0] == "a fine film that I loved"
