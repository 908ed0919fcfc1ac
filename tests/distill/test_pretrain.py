import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
from edgedistill.common import settings
from edgedistill.common.config.training import ModelConfig, OptimConfig, RuntimeConfig
from edgedistill.common.data import load_unlabelled
from edgedistill.common.recipe import load_recipe
from edgedistill.distill import heads, pretrain, stages, tokenization
from edgedistill.distill.device import resolve
from edgedistill.distill.pretrain import (
    LanguageModelObjective,
    MaskedBatches,
    build_model,
    lm_metrics,
    make_blocks,
    scaled_loss,
    scratch_positions,
    scratch_tokenizer,
    word_spans,
)
from edgedistill.distill.tokenization import load_tokenizer, train_tokenizer
from edgedistill.distill.trainer import MicroBatch, Trainer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
)

from tests.conftest import ROOT, run_here
from tests.distill.distilbert_init import write_distilbert
from tests.distill.gpt_init import write_gpt2
from tests.distill.ranks import on_two_ranks
from tests.roberta_init import write_roberta

TEXTS = ["unbelievably wonderful storytelling everywhere", "remarkably unwatchable screenplays"] * 50


def tokenizer(family):
    return train_tokenizer(family, TEXTS, 120)


def test_bert_blocks_are_wrapped_and_full_length():
    tok = tokenizer("bert")
    blocks = make_blocks(tok, TEXTS, 16, "bert", with_offsets=False)
    assert blocks
    assert all(len(b["input_ids"]) == 16 for b in blocks)
    assert all(b["input_ids"][0] == tok.cls_token_id for b in blocks)
    assert all(b["input_ids"][-1] == tok.sep_token_id for b in blocks)


def test_blocks_hold_token_ids_as_int32():
    assert make_blocks(tokenizer("bert"), TEXTS, 16, "bert", with_offsets=True).ids.dtype == np.int32


def test_blocks_are_the_same_whether_texts_are_tokenized_at_once_or_in_chunks(monkeypatch):
    tok = tokenizer("bert")
    whole = make_blocks(tok, TEXTS, 16, "bert", with_offsets=True)[:]
    monkeypatch.setattr(tokenization, "ENCODE_CHUNK", 7)
    assert make_blocks(tok, TEXTS, 16, "bert", with_offsets=True)[:] == whole


def test_blocks_with_a_name_print_their_progress_in_status_lines(monkeypatch, capsys):
    monkeypatch.setenv(settings.PROGRESS_VAR, "lines")
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "0.000001")
    make_blocks(tokenizer("bert"), TEXTS * 30, 16, "bert", with_offsets=False, desc="blocks")
    assert f"[blocks] {len(TEXTS) * 30:,}/{len(TEXTS) * 30:,} text (100%)" in capsys.readouterr().err


def test_gpt_blocks_separate_texts_with_eos():
    tok = tokenizer("gpt")
    blocks = make_blocks(tok, TEXTS, 16, "gpt", with_offsets=False)
    flat = [i for b in blocks for i in b["input_ids"]]
    assert tok.eos_token_id in flat
    assert all(len(b["input_ids"]) == 16 for b in blocks)


def test_a_model_from_scratch_has_positions_for_its_pretraining_blocks():
    cfg = ModelConfig(family="gpt", hidden_size=16, num_heads=2, num_layers=1, intermediate_size=32)
    assert build_model(cfg, tokenizer("gpt"), seq_len=600).config.max_position_embeddings == 600


def test_causal_lm_learns_the_eos_between_texts_when_the_tokenizer_pads_with_eos(tmp_path):
    folder = write_gpt2(tmp_path / "gpt2", TEXTS)
    tok = load_tokenizer(str(folder))  # GPT-2 has no pad token: it pads with its EOS
    batch = DataCollatorForLanguageModeling(tok, mlm=False)(make_blocks(tok, TEXTS, 16, "gpt", with_offsets=False)[:])
    _, _, labels = LanguageModelObjective(GPT2LMHeadModel.from_pretrained(folder), causal=True)(**batch)
    assert tok.eos_token_id in labels.tolist()


def test_masking_rates_and_whole_words():
    tok = tokenizer("bert")
    blocks = make_blocks(tok, TEXTS * 20, 32, "bert", with_offsets=True)
    plain = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=0)
    batch = plain([{"input_ids": b["input_ids"]} for b in blocks])
    chosen = batch["labels"] != -100
    assert 0.10 < chosen.float().mean() < 0.20
    replaced = batch["input_ids"][chosen] == tok.mask_token_id
    assert 0.7 < replaced.float().mean() < 0.9  # 80% [MASK], the rest random or kept
    wwm = DataCollatorForLanguageModeling(
        tok, mlm_probability=0.15, whole_word_mask=True, mask_replace_prob=1.0, random_replace_prob=0.0, seed=0
    )
    batch = wwm(blocks[:])
    ids, labels = batch["input_ids"], batch["labels"]
    # A masked word piece ("##...") never stands next to an unmasked piece of the same word.
    for row_ids, row_labels in zip(ids.tolist(), labels.tolist(), strict=True):
        original = [lab if lab != -100 else i for i, lab in zip(row_ids, row_labels, strict=True)]
        for pos in range(1, len(original)):
            if tok.convert_ids_to_tokens(original[pos]).startswith("##"):
                assert (row_labels[pos] != -100) == (row_labels[pos - 1] != -100)
    assert (labels != -100).any()
    assert torch.equal(
        batch["input_ids"][labels != -100], torch.full_like(batch["input_ids"][labels != -100], tok.mask_token_id)
    )


def sentencepiece_style(texts: list[str]) -> PreTrainedTokenizerFast:
    """A Unigram tokenizer whose words begin with `▁`, as DeBERTa-v2/v3's, BigBird's and RemBERT's, trained on
    `texts`: a word's offsets span the space before it ("a dull" gives `▁dull` (1, 6))."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.UnigramTrainer(vocab_size=2000, special_tokens=specials, unk_token="[UNK]", show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def test_word_spans_leave_out_the_space_a_token_begins_with():
    assert word_spans("a dull film", [(0, 1), (1, 6), (6, 11)]) == [(0, 1), (2, 6), (7, 11)]


def test_word_spans_of_a_wordpiece_tokenizer_are_its_offsets():
    tok = tokenizer("bert")
    offsets = tok(TEXTS[0], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert word_spans(TEXTS[0], offsets) == offsets


def test_whole_word_masking_masks_words_of_a_tokenizer_whose_offsets_span_the_space_before_them(data_dir):
    texts = load_unlabelled([str(data_dir / "unlabeled" / "movie_reviews.txt")], 300)
    tok = sentencepiece_style(texts)
    wwm = DataCollatorForLanguageModeling(
        tok, mlm_probability=0.15, whole_word_mask=True, mask_replace_prob=1.0, random_replace_prob=0.0, seed=0
    )
    masked = wwm(make_blocks(tok, texts, 64, "bert", with_offsets=True)[:256])["labels"] != -100
    # read as one word a text, most blocks had nothing masked and the rest nearly everything
    assert (masked.sum(1) == 0).float().mean() < 0.1


def test_a_scratch_tokenizers_length_limit_is_its_models_positions(tmp_path):
    cfg = ModelConfig(vocab_size=200)
    tok = scratch_tokenizer(cfg, 600, TEXTS, tmp_path / "tokenizer")
    assert tok.model_max_length == scratch_positions(cfg, 600)


def _scratch_vocab(reviews: str, folder: str) -> dict[str, int]:
    """The vocabulary of the from-scratch tokenizer of 300 reviews kept in `folder`, as this rank reads it."""
    texts = load_unlabelled([reviews], 300)
    return scratch_tokenizer(ModelConfig(vocab_size=2000), 128, texts, Path(folder)).get_vocab()


def test_a_scratch_tokenizer_is_read_back_by_a_resumed_run_as_first_trained(data_dir, tmp_path):
    reviews, folder = str(data_dir / "unlabeled" / "movie_reviews.txt"), tmp_path / "tokenizer"
    first = _scratch_vocab(reviews, str(folder))
    # other texts, which a tokenizer trained again would take its vocabulary from
    assert scratch_tokenizer(ModelConfig(vocab_size=2000), 128, TEXTS, folder).get_vocab() == first


def test_two_ranks_share_one_scratch_tokenizer(data_dir, tmp_path):
    reviews = str(data_dir / "unlabeled" / "movie_reviews.txt")
    vocab = on_two_ranks(tmp_path, _scratch_vocab, reviews, str(tmp_path / "tokenizer"))
    assert vocab[0] == vocab[1]


def _slowly_trained_scratch_vocab(reviews: str, folder: str) -> dict[str, int]:
    """`_scratch_vocab`, with rank 0's training taking 4 s longer."""

    def slow(*args):
        time.sleep(4)
        return train_tokenizer(*args)

    if torch_dist.get_rank() == 0:
        pretrain.train_tokenizer = slow  # this rank's process alone, which ends with the job
    return _scratch_vocab(reviews, folder)


def test_ranks_wait_for_a_scratch_tokenizer_past_their_collectives_timeout(data_dir, tmp_path):
    reviews = str(data_dir / "unlabeled" / "movie_reviews.txt")
    vocab = on_two_ranks(tmp_path, _slowly_trained_scratch_vocab, reviews, str(tmp_path / "tokenizer"), timeout_s=2)
    assert vocab[0] == vocab[1]


class Lines(list):
    """A list of lines a weak reference can follow."""


def test_the_stage_holds_no_corpus_text_while_it_trains(monkeypatch):
    read = []

    def load_lines(*args, **kwargs):
        lines = Lines(load_unlabelled(*args, **kwargs))
        read.append(weakref.ref(lines))
        return lines

    fit, held = Trainer.fit, []

    def fit_noting_what_is_held(self, *args, **kwargs):
        held.append(sum(ref() is not None for ref in read))  # lists of lines still alive as training starts
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(pretrain, "load_unlabelled", load_lines)
    monkeypatch.setattr(Trainer, "fit", fit_noting_what_is_held)
    stages.pretrain(load_recipe(ROOT / "recipes" / "smoke.yaml", {"pretrain.optim.max_steps": 2})).run()
    assert held == [0]


@pytest.fixture
def too_few_to_hold_out():
    """`distill pretrain` of the smoke recipe holding out 500 of the first 10 train lines."""
    return run_here(
        "distill",
        "pretrain",
        ROOT / "recipes" / "smoke.yaml",
        "--pretrain.eval_files=[]",
        "--pretrain.train_max_lines=10",
        "--pretrain.eval_holdout_lines=500",
    )


def test_too_few_lines_to_hold_out_fail_naming_the_settings(too_few_to_hold_out):
    assert too_few_to_hold_out.returncode == 2
    assert "pretrain.train_files: 10 non-empty lines read are too few to hold out pretrain.eval_holdout_lines=500" in (
        too_few_to_hold_out.stderr
    )


def test_too_few_lines_to_hold_out_of_the_lines_train_max_lines_reads_suggest_raising_it(too_few_to_hold_out):
    assert "name pretrain.eval_files, or raise pretrain.train_max_lines" in too_few_to_hold_out.stderr


@pytest.mark.parametrize(
    "args, refusal",
    [
        (
            ["--pretrain.eval_files=[]", "--pretrain.eval_holdout_lines=1"],
            "error: pretrain.eval_holdout_lines=1: the lines held out of pretrain.train_files for evaluation hold "
            "fewer tokens than one block of pretrain.seq_len=2048; raise eval_holdout_lines, name pretrain.eval_files, "
            "or lower",
        ),
        (
            ["--pretrain.train_max_lines=1"],
            "error: pretrain.train_files: the training text holds fewer tokens than one block of "
            "pretrain.seq_len=2048; add lines or raise pretrain.train_max_lines, or lower seq_len",
        ),
    ],
    ids=["too few held-out lines", "a training text too short"],
)
def test_a_corpus_too_short_for_one_block_fails_naming_the_settings(args, refusal):
    result = run_here("distill", "pretrain", ROOT / "recipes" / "smoke.yaml", *args, "--pretrain.seq_len=2048")
    assert refusal in result.stderr


def test_a_pretraining_that_diverged_stops_the_stage_naming_its_learning_rate():
    result = run_here(
        "distill",
        "pretrain",
        ROOT / "recipes" / "smoke.yaml",
        "--pretrain.optim.max_steps=1",
        "--pretrain.optim.lr=1e30",
        "--pretrain.optim.warmup_ratio=0",
    )
    assert "pretrain: training diverged, its held-out loss is nan; lower pretrain.optim.lr (1e+30)" in result.stderr


def pretrain_mean_pooled(init, *extra: str):
    """One step of the smoke recipe's pretraining from `init`, for a teacher fine-tuned with `pooling: mean`."""
    args = [f"--model.init={init}", "--finetune.pooling=mean", "--pretrain.optim.max_steps=1", *extra]
    return run_here("distill", "pretrain", ROOT / "recipes" / "smoke.yaml", *args)


def test_mean_pooling_of_a_roberta_init_is_refused_before_pretraining(tmp_path):
    init = write_roberta(tmp_path / "roberta", TEXTS)
    # --export=null: the smoke recipe's fused teacher bundle would be refused first
    result = pretrain_mean_pooled(init, "--export=null")
    assert f"finetune.pooling=mean builds a BERT encoder, but {init} is a roberta" in result.stderr


def test_classifier_dropout_for_an_init_without_the_field_is_refused_before_pretraining(tmp_path):
    init = write_distilbert(tmp_path / "distilbert", TEXTS)
    args = [f"--model.init={init}", "--finetune.classifier_dropout=0.1", "--pretrain.optim.max_steps=1"]
    result = run_here("distill", "pretrain", ROOT / "recipes" / "smoke.yaml", *args)
    assert f"error: finetune.classifier_dropout=0.1, but {init} is a distilbert, whose config has" in result.stderr


def test_pretraining_continues_from_a_mean_pooled_teacher(tmp_path):
    init = tmp_path / "mean-teacher"
    tok = tokenizer("bert")
    config = heads.MeanPooledBertConfig(
        vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    heads.MeanPooledBertForSequenceClassification(config).save_pretrained(init)
    tok.save_pretrained(init)
    result = pretrain_mean_pooled(init)
    assert result.returncode == 0, result.stderr


def test_masked_lm_objective_of_a_roberta_checkpoint_is_its_own_mlm_loss():
    config = RobertaConfig(
        vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    lm = RobertaForMaskedLM(config).eval()
    ids = torch.randint(5, 120, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    loss, _, _ = LanguageModelObjective(lm, causal=False)(**batch)
    assert torch.allclose(loss, lm(**batch).loss)


def _mlm_batch(masked: bool) -> dict[str, torch.Tensor]:
    """Two blocks of a tiny vocabulary, position 3 masked in each, or none at all."""
    ids = torch.randint(5, 120, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    if masked:
        labels[:, 3] = ids[:, 3]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _tiny_bert_mlm() -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    return BertForMaskedLM(config)


def test_a_batch_without_masked_positions_has_a_zero_loss():
    loss, _, _ = LanguageModelObjective(_tiny_bert_mlm(), causal=False)(**_mlm_batch(masked=False))
    assert loss.item() == 0.0


@pytest.fixture
def unmasked_backward() -> LanguageModelObjective:
    """A tiny masked LM's objective after the backward pass of a batch without masked positions."""
    objective = LanguageModelObjective(_tiny_bert_mlm(), causal=False)
    objective(**_mlm_batch(masked=False))[0].backward()
    return objective


def test_a_batch_without_masked_positions_backpropagates_to_every_trainable_parameter(unmasked_backward):
    assert [n for n, p in unmasked_backward.named_parameters() if p.requires_grad and p.grad is None] == []


def test_a_batch_without_masked_positions_backpropagates_zero_gradients(unmasked_backward):
    grads = [p.grad for p in unmasked_backward.parameters() if p.grad is not None]
    assert grads and not any(grad.any() for grad in grads)


def test_an_eval_batch_without_masked_positions_is_left_out_of_the_eval_figures():
    objective = LanguageModelObjective(_tiny_bert_mlm(), causal=False).eval()
    cpu = resolve(RuntimeConfig(device="cpu", precision="fp32"))
    with_empty = lm_metrics(objective, [_mlm_batch(masked=True), _mlm_batch(masked=False)], cpu)
    assert with_empty == lm_metrics(objective, [_mlm_batch(masked=True)], cpu)


def _mlm_objective(vocab_size: int) -> LanguageModelObjective:
    """A one-layer BERT's masked-LM objective without dropout, drawn from seed 0."""
    config = BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    return LanguageModelObjective(BertForMaskedLM(config), causal=False)


def _gradient(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _mlm_step_gradient(folder, grad_accum: int) -> torch.Tensor:
    """The gradient of one masked-LM step over 4 blocks of 12 tokens (30% masked), taken in `grad_accum` micro-batches,
    without dropout."""
    tok = tokenizer("bert")
    objective = _mlm_objective(len(tok))
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.3)
    batches = MaskedBatches(collator, make_blocks(tok, TEXTS, 12, "bert", False), causal=False)
    optim = OptimConfig(lr=1e-3, batch_size=4, grad_accum=grad_accum, max_steps=1)
    trainer = Trainer(objective, optim, folder, "h", "test", resolve(RuntimeConfig(device="cpu", precision="fp32")))
    grads = []
    trainer.optimizer.register_step_pre_hook(lambda *_: grads.append(_gradient(objective)))
    torch.manual_seed(2)  # masks 2, 2, 5 and 2 tokens: micro-batches of blocks 0, 2 and 1, 3 hold 7 and 4
    trainer.fit(lambda epoch: [[0, 1, 2, 3]], batches, scaled_loss, lambda m: {"score": 0.0}, "score",
                lambda m, _: None)  # fmt: skip
    return grads[0]


def test_a_masked_lm_step_has_the_same_gradient_whatever_the_split_of_its_batch(tmp_path):
    whole, split = _mlm_step_gradient(tmp_path / "one", 1), _mlm_step_gradient(tmp_path / "two", 2)
    assert (split - whole).abs().max().item() < 1e-6


def _ddp_mlm_step(tokenizer_dir: str, folder: str) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
    """One masked-LM step over 4 blocks of 12 tokens (30% masked) on this rank, without dropout or clipping: the
    gradient it stepped with, and the inputs of the blocks it ran, masked with draws of its own (as arrays: a tensor
    would reach the test through this process's shared memory, gone once it ends)."""
    tok = load_tokenizer(tokenizer_dir)
    objective = _mlm_objective(len(tok))
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.3)
    batches, ran = MaskedBatches(collator, make_blocks(tok, TEXTS, 12, "bert", False), causal=False), []

    def make_batch(part):
        inputs = batches(part)
        ran.append({key: value.numpy() for key, value in inputs[0].items()})
        return inputs

    optim = OptimConfig(lr=1e-3, batch_size=4, max_steps=1, grad_clip=1e9)
    trainer = Trainer(objective, optim, folder, "h", "test", resolve(RuntimeConfig(device="cpu", precision="fp32")))
    grads = []
    trainer.optimizer.register_step_pre_hook(lambda *_: grads.append(_gradient(objective)))
    trainer.fit(lambda epoch: [[0, 1, 2, 3]], make_batch, scaled_loss, lambda m: {"score": 0.0}, "score",
                lambda m, _: None)  # fmt: skip
    return grads[0].numpy(), ran


def test_under_ddp_a_masked_lm_step_s_gradient_is_the_mean_over_every_rank_s_predicted_tokens(tmp_path):
    tok = tokenizer("bert")
    tok.save_pretrained(tmp_path / "tokenizer")
    said = on_two_ranks(tmp_path, _ddp_mlm_step, str(tmp_path / "tokenizer"), str(tmp_path / "run"))
    inputs = [{key: torch.from_numpy(value) for key, value in batch.items()} for batch in said[0][1] + said[1][1]]
    predicted = [int((batch["labels"] != -100).sum()) for batch in inputs]
    objective = _mlm_objective(len(tok))
    total = sum(objective(**batch)[0] * count for batch, count in zip(inputs, predicted, strict=True))
    (total / sum(predicted)).backward()
    assert (torch.from_numpy(said[0][0]) - _gradient(objective)).abs().max().item() < 1e-6


def test_the_micro_batches_of_a_step_are_masked_as_their_whole_batch():
    tok = tokenizer("bert")
    blocks = make_blocks(tok, TEXTS, 12, "bert", False)
    torch.manual_seed(0)
    batches = MaskedBatches(DataCollatorForLanguageModeling(tok, mlm_probability=0.3), blocks, causal=False)
    batch = [3, 0, 2, 1]
    parts = [batches(MicroBatch(batch[i::2], batch))[0]["labels"] for i in range(2)]
    torch.manual_seed(0)
    whole = batches(MicroBatch(list(batch), list(batch)))[0]["labels"]
    assert torch.equal(torch.cat(parts), whole[[0, 2, 1, 3]])


def test_a_causal_lm_batch_taken_whole_has_its_plain_mean_loss(tmp_path):
    write_gpt2(tmp_path / "gpt", TEXTS)
    tok = load_tokenizer(str(tmp_path / "gpt"))
    objective = LanguageModelObjective(GPT2LMHeadModel.from_pretrained(tmp_path / "gpt"), causal=True)
    batches = MaskedBatches(
        DataCollatorForLanguageModeling(tok, mlm=False), make_blocks(tok, TEXTS, 12, "gpt", False), causal=True
    )
    inputs = batches(MicroBatch([0, 1, 2], [0, 1, 2]))
    assert scaled_loss(objective, inputs).item() == objective(**inputs[0])[0].item()
