import random

import torch
from edgedistill.distill.batching import collate, length_grouped_batches
from hypothesis import given
from hypothesis import strategies as st


@given(st.lists(st.integers(1, 60), min_size=1, max_size=400), st.integers(1, 40), st.integers(0, 10))
def test_batches_cover_every_example_once(lengths, batch_size, seed):
    batches = length_grouped_batches(lengths, batch_size, seed)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)


def test_length_grouped_batches_repeat_for_a_seed_and_differ_across_seeds():
    rng = random.Random(0)
    lengths = [rng.randint(2, 60) for _ in range(5000)]
    a = length_grouped_batches(lengths, 32, seed=1)
    assert a == length_grouped_batches(lengths, 32, seed=1)
    assert a != length_grouped_batches(lengths, 32, seed=2)


def test_length_grouping_pads_far_less_than_random_batches():
    rng = random.Random(0)
    lengths = [rng.randint(2, 60) for _ in range(5000)]
    a = length_grouped_batches(lengths, 32, seed=1)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in a)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    naive = sum(32 * max(lengths[i] for i in order[s : s + 32]) for s in range(0, len(order), 32))
    assert padded < 0.6 * naive, "length grouping should cut padding sharply"


def test_collate_pads_and_masks():
    feats = {"input_ids": [[5, 6, 7], [8]], "token_type_ids": [[0, 0, 0], [0]]}
    out = collate(feats, [1, 0], pad_id=0)
    assert out["input_ids"].tolist() == [[8, 0, 0], [5, 6, 7]]
    assert out["attention_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert out["token_type_ids"].shape == (2, 3)
    assert out["input_ids"].dtype == torch.long


def test_layer_decay_scales_learning_rates_by_depth():
    from edgedistill.common.config.training import OptimConfig
    from edgedistill.distill.trainer import _param_groups
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(
        BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=3, num_attention_heads=2, intermediate_size=16)
    )
    groups = _param_groups(model, OptimConfig(lr=1.0, layer_decay=0.5, weight_decay=0.1))
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert lr_of[id(params["classifier.weight"])] == 1.0
    assert lr_of[id(params["bert.encoder.layer.2.output.dense.weight"])] == 0.5
    assert lr_of[id(params["bert.encoder.layer.0.output.dense.weight"])] == 0.125
    assert lr_of[id(params["bert.embeddings.word_embeddings.weight"])] == 0.0625
    assert wd_of[id(params["bert.encoder.layer.0.output.LayerNorm.weight"])] == 0.0
    assert wd_of[id(params["bert.encoder.layer.0.output.dense.weight"])] == 0.1
    flat = _param_groups(model, OptimConfig(lr=1.0))
    assert {g["lr"] for g in flat} == {1.0}
    assert sum(len(g["params"]) for g in flat) == len(params)
