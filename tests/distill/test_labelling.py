"""Labelling the transfer set: logits that are not numbers are refused before a shard holds them."""

import pytest
from edgedistill.common.config.training import TransferConfig
from edgedistill.common.recipe import RecipeError
from edgedistill.distill.finetune import hf_logits
from edgedistill.distill.labelling import SecondPass, label_checked

from tests.distill.test_transfer import BF16, CPU, TEXTS, CountingModel, WordTokenizer

CFG = TransferConfig(unlabelled_files=["x"], shard_size=3, label_batch_size=2)  # TEXTS in shards of 3, 3 and 2


def on_the_last_text(forward, value: float):
    """`forward` with both logits of the last of TEXTS (its ids sum to 9) set to `value`."""

    def changed(batch):
        logits = forward(batch)
        logits[(batch["input_ids"] * batch["attention_mask"]).sum(-1) == 9] = value
        return logits

    return changed


def refusal(tmp_path, forward, placement=CPU, **kwargs) -> str:
    """The error of labelling TEXTS by `forward` in `placement`."""
    model = CountingModel()
    with pytest.raises(RecipeError) as refused:
        label_checked(model, forward, WordTokenizer(), TEXTS, None, CFG, tmp_path, placement, True, **kwargs)
    return str(refused.value)


def test_nan_logits_are_refused_naming_how_many_texts_of_which_shard(tmp_path):
    forward = on_the_last_text(hf_logits(CountingModel()), float("nan"))
    assert "1 of the 2 texts of shard logits-00002.npy got logits" in refusal(tmp_path, forward)


def test_nan_logits_are_refused_naming_the_labeller_and_its_precision(tmp_path):
    forward = on_the_last_text(hf_logits(CountingModel()), float("nan"))
    assert "from the teacher in PyTorch (bf16) that are NaN" in refusal(tmp_path, forward, BF16)


def test_a_shard_holding_nan_logits_is_not_written(tmp_path):
    refusal(tmp_path, on_the_last_text(hf_logits(CountingModel()), float("nan")))
    assert not (tmp_path / "logits-00002.npy").exists()


def test_logits_past_the_range_of_float16_are_refused(tmp_path):
    forward = on_the_last_text(hf_logits(CountingModel()), 1e5)  # finite in fp32, infinite in the float16 shard
    assert "NaN or infinite as float16" in refusal(tmp_path, forward)


def test_nan_logits_of_an_int8_labellers_second_pass_name_the_bundle_and_the_pass(tmp_path):
    teacher = on_the_last_text(hf_logits(CountingModel()), float("nan"))
    second = SecondPass(teacher, 1.0, 0, 2, CPU)
    unsure = on_the_last_text(hf_logits(CountingModel()), 0.0)  # no margin: the second pass labels it again
    why = refusal(tmp_path, unsure, second_pass=second, labeller="the labeller bundle bundle-teacher-int8")
    assert "from the labeller bundle bundle-teacher-int8 (INT8) with its second pass in PyTorch (fp32)" in why


def test_the_refusal_leaves_the_shards_before_it(tmp_path):
    refusal(tmp_path, on_the_last_text(hf_logits(CountingModel()), float("nan")))
    assert sorted(path.name for path in tmp_path.glob("logits-*.npy")) == ["logits-00000.npy", "logits-00001.npy"]
