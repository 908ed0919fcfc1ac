import pytest
import torch
import torch.nn.functional as F
from edgedistill.distill.students import (
    ARCHITECTURES,
    BiLSTMClassifier,
    CNNClassifier,
    Student,
    StudentConfig,
    StudentError,
    TransformerClassifier,
    _teacher_embedding_basis,
    build_student,
    check_student,
    count_parameters,
    init_from_teacher,
    pair_sides,
)
from pydantic import ValidationError
from torch import nn
from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

from tests.distill import extension

VOCAB = 50
TINY = dict(
    vocab_size=VOCAB,
    embed_dim=16,
    hidden_size=16,
    num_heads=2,
    intermediate_size=32,
    num_filters=8,
    kernel_sizes=[2, 3],
    max_length=32,
    dropout=0.1,
)
ARCHS = ["bilstm", "cnn", "transformer"]


def _student(arch: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    return build_student(StudentConfig(arch=arch, **{**TINY, **overrides})).eval()


def _tiny_teacher() -> BertModel:
    torch.manual_seed(1)
    config = BertConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, vocab_size=100
    )
    return BertModel(config).eval()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("length", [1, 2, 7])
def test_every_student_gives_finite_logits_of_shape_batch_by_labels(arch, batch, length):
    ids = torch.randint(1, VOCAB, (batch, length))
    logits = _student(arch)(ids, torch.ones_like(ids))
    assert logits.shape == (batch, 2)
    assert torch.isfinite(logits).all()


def _ragged_batch(fill: str) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Three right-padded rows of lengths 1, 4, 6 in width 9; padding is [PAD] (0) or random ids."""
    generator = torch.Generator().manual_seed(2)
    lengths = [1, 4, 6]
    ids = torch.randint(1, VOCAB, (3, 9), generator=generator)
    mask = (torch.arange(9) < torch.tensor(lengths).unsqueeze(1)).long()
    if fill == "pad":
        ids = ids * mask
    return ids, mask, lengths


@pytest.mark.parametrize(
    ("arch", "pooling"),
    [(arch, "max") for arch in ARCHS] + [("bilstm", "mean"), ("bilstm", "last")],
)
@pytest.mark.parametrize("fill", ["pad", "random"])
def test_padding_does_not_change_logits(arch, pooling, fill):
    model = _student(arch, pooling=pooling)
    if isinstance(getattr(model, "embed", None), nn.Embedding):
        with torch.no_grad():
            model.embed.weight[0].normal_()  # even a non-zero [PAD] vector must not leak in
    ids, mask, lengths = _ragged_batch(fill)
    with torch.no_grad():
        padded = model(ids, mask)
        alone = torch.cat([model(ids[i : i + 1, :n], mask[i : i + 1, :n]) for i, n in enumerate(lengths)])
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_few_steps_learn_a_tiny_task(arch):
    model = _student(arch, dropout=0.0).train()
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(2, VOCAB, (16, 6), generator=generator)
    labels = torch.arange(16) % 2
    ids[labels == 1, 2] = 1  # the positive class contains token 1
    mask = torch.ones_like(ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(ids, mask), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_bilstm_is_one_bidirectional_lstm():
    lstms = [m for m in _student("bilstm").modules() if isinstance(m, nn.LSTM)]
    assert len(lstms) == 1
    assert lstms[0].bidirectional
    assert lstms[0].num_layers == 1
    assert lstms[0].batch_first


def bf16_states_and_logits(model: Student) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[2, 5, 7, 3], [2, 6, 3, 0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model.encode(ids, (ids != 0).long()), model(ids, (ids != 0).long())


def test_the_bilstm_runs_its_lstm_in_fp32_under_cpu_bf16_autocast():
    """oneDNN has no bf16 LSTM on a CPU without AVX512-BF16: an explicit bf16 run must not reach it."""
    states, _ = bf16_states_and_logits(_student("bilstm"))
    assert states.dtype == torch.float32


def test_the_bilstm_gives_logits_under_cpu_bf16_autocast():
    _, logits = bf16_states_and_logits(_student("bilstm"))
    assert logits.shape == (2, 2)


def test_transformer_returns_internals_with_expected_shapes():
    model = _student("transformer", num_layers=2)
    ids = torch.randint(1, VOCAB, (3, 5))
    mask = torch.ones_like(ids)
    logits, hidden, attentions = model(ids, mask, return_internals=True)
    assert logits.shape == (3, 2)
    assert len(hidden) == 3
    assert all(h.shape == (3, 5, 16) for h in hidden)
    assert len(attentions) == 2
    assert all(a.shape == (3, 2, 5, 5) for a in attentions)
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(3, 2, 5))
    torch.testing.assert_close(logits, model(ids, mask))


def test_init_from_teacher_copies_embeddings_and_mapped_layers():
    teacher = _tiny_teacher()
    student = _student("transformer", vocab_size=100, hidden_size=32, intermediate_size=64, num_layers=2)
    init_from_teacher(student, teacher)
    ours, theirs = student.bert.embeddings, teacher.embeddings
    assert torch.equal(ours.word_embeddings.weight, theirs.word_embeddings.weight)
    assert torch.equal(ours.position_embeddings.weight, theirs.position_embeddings.weight[:32])
    assert torch.equal(ours.token_type_embeddings.weight, theirs.token_type_embeddings.weight)
    assert torch.equal(ours.LayerNorm.weight, theirs.LayerNorm.weight)
    for student_index, teacher_index in [(0, 1), (1, 3)]:
        mine = student.bert.encoder.layer[student_index].state_dict()
        source = teacher.encoder.layer[teacher_index].state_dict()
        assert mine.keys() == source.keys()
        assert all(torch.equal(mine[name], source[name]) for name in mine)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(vocab_size=100, hidden_size=16, intermediate_size=64), "hidden_size 16 vs 32"),
        (dict(vocab_size=100, hidden_size=32, intermediate_size=32), "intermediate_size 32 vs 64"),
        (dict(vocab_size=150, hidden_size=32, intermediate_size=64), "vocab sizes differ: student 150 vs teacher 100"),
        (dict(vocab_size=100, hidden_size=32, intermediate_size=64, max_length=600), "max_length 600"),
    ],
)
def test_init_from_teacher_rejects_a_transformer_that_does_not_fit(overrides, message):
    with pytest.raises(ValueError, match=message):
        init_from_teacher(_student("transformer", **overrides), _tiny_teacher())


@pytest.mark.parametrize(("setting", "value"), [("hidden_act", "relu"), ("layer_norm_eps", 1e-3)])
def test_init_from_teacher_rejects_a_teacher_whose_layers_compute_another_function(setting, value):
    teacher = BertModel(BertConfig(**(_tiny_teacher().config.to_dict() | {setting: value}))).eval()
    with pytest.raises(ValueError, match=f"another function: {setting}"):
        init_from_teacher(_student("transformer", vocab_size=100, hidden_size=32, intermediate_size=64), teacher)


@pytest.mark.parametrize("arch", ["bilstm", "cnn"])
@pytest.mark.parametrize("embed_dim", [8, 32, 40])
def test_init_from_teacher_projects_word_embeddings(arch, embed_dim):
    teacher = _tiny_teacher()
    student = _student(arch, vocab_size=100, embed_dim=embed_dim)
    init_from_teacher(student, teacher)
    words = student.embed.weight
    assert words.shape == (100, embed_dim)
    assert torch.equal(words[0], torch.zeros(embed_dim))
    kept = min(embed_dim, 32)
    variances = words[1:, :kept].var(0)
    assert torch.all(variances[:-1] >= variances[1:] - 1e-4)  # principal components, largest first
    assert torch.equal(words[:, kept:], torch.zeros(100, embed_dim - kept))
    if embed_dim >= 32:  # all components kept: distances are the teacher's up to one scale factor
        ratio = torch.pdist(words[1:]) / torch.pdist(teacher.embeddings.word_embeddings.weight[1:])
        torch.testing.assert_close(ratio, torch.full_like(ratio, ratio[0].item()), atol=1e-4, rtol=1e-4)


def test_init_from_teacher_starts_any_student_with_an_embed_layer():
    teacher = _tiny_teacher()
    student = extension.BagOfWords(StudentConfig(arch="cnn", **{**TINY, "vocab_size": 100}))
    init_from_teacher(student, teacher)
    expected = _teacher_embedding_basis(teacher.embeddings.word_embeddings.weight, TINY["embed_dim"])
    torch.testing.assert_close(student.embed.weight[1:], expected[1:])
    assert torch.equal(student.embed.weight[0], torch.zeros(TINY["embed_dim"]))


def test_init_from_teacher_needs_the_teachers_vocabulary():
    with pytest.raises(ValueError, match="vocab sizes differ: student 150 vs teacher 100"):
        init_from_teacher(_student("cnn", vocab_size=150), _tiny_teacher())


def test_init_from_teacher_takes_the_first_rows_of_a_teacher_with_padded_embeddings():
    teacher = _tiny_teacher()  # 100 rows, as a checkpoint padding its embeddings past a tokenizer of 50 tokens
    student = _student("cnn", embed_dim=8)
    init_from_teacher(student, teacher)
    expected = _teacher_embedding_basis(teacher.embeddings.word_embeddings.weight[:VOCAB], 8)
    torch.testing.assert_close(student.embed.weight[1:], expected[1:])


def test_a_transformer_student_takes_the_first_rows_of_a_teacher_with_padded_embeddings():
    teacher = _tiny_teacher()
    student = _student("transformer", hidden_size=32, intermediate_size=64, num_layers=2)
    init_from_teacher(student, teacher)
    assert torch.equal(
        student.bert.embeddings.word_embeddings.weight, teacher.embeddings.word_embeddings.weight[:VOCAB]
    )


def test_init_from_teacher_rejects_other_modules():
    with pytest.raises(TypeError, match="Linear"):
        init_from_teacher(nn.Linear(2, 2), _tiny_teacher())


def test_count_parameters_by_hand():
    assert count_parameters(nn.Linear(3, 2)) == 8
    e, h, c = 16, 16, 2
    lstm = 2 * (4 * h * e + 4 * h * h + 8 * h)
    expected = VOCAB * e + lstm + (2 * h * h + h) + (h * c + c)
    assert count_parameters(_student("bilstm")) == expected


def test_build_student_picks_the_architecture():
    assert isinstance(_student("bilstm"), BiLSTMClassifier)
    assert isinstance(_student("cnn"), CNNClassifier)
    assert isinstance(_student("transformer"), TransformerClassifier)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(arch="transformer", hidden_size=15), "divisible"),
        (dict(arch="bilstm", num_layers=2), "num_layers=1"),
        (dict(arch="cnn", kernel_sizes=[0, 3]), "kernel_sizes"),
        (dict(arch="cnn", pad_token_id=VOCAB), "pad_token_id"),
        (dict(arch="cnn", poolling="max"), "poolling"),
        (dict(arch="rnn"), "arch"),
    ],
)
def test_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValidationError, match=message):
        StudentConfig(**{**TINY, **overrides})


def _pair_batch(generator_seed: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Three pairs `[CLS] A [SEP] B [SEP]` (side lengths given), right-padded in width 12 with random ids."""
    generator = torch.Generator().manual_seed(generator_seed)
    sides = [(3, 2), (5, 4), (2, 6)]
    ids = torch.randint(1, VOCAB, (3, 12), generator=generator)
    positions = torch.arange(12)
    first = torch.tensor([a for a, _ in sides]).unsqueeze(1)
    total = torch.tensor([a + b for a, b in sides]).unsqueeze(1)
    mask = (positions < total).long()
    types = ((positions >= first) & (positions < total)).long()
    return ids, mask, types, sides


def test_pair_sides_puts_each_sentence_at_the_start_of_its_own_row():
    ids, mask, types, sides = _pair_batch()
    both, masks = pair_sides(ids, mask, types)
    assert both.shape == (6, 12)
    assert masks.sum(1).tolist() == [a for a, _ in sides] + [b for _, b in sides]
    assert [both[3 + i, :b].tolist() for i, (a, b) in enumerate(sides)] == [
        ids[i, a : a + b].tolist() for i, (a, b) in enumerate(sides)
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_pair_student_gives_one_row_of_logits_per_pair(arch):
    ids, mask, types, _ = _pair_batch()
    logits = _student(arch, pairs=True)(ids, mask, types)
    assert logits.shape == (3, 2)


@pytest.mark.parametrize("arch", ARCHS)
def test_pair_student_reads_sentence_b(arch):
    ids, mask, types, _ = _pair_batch()
    other = ids.clone()
    other[types.bool()] = torch.randint(1, VOCAB, (int(types.sum()),), generator=torch.Generator().manual_seed(9))
    model = _student(arch, pairs=True)
    with torch.no_grad():
        assert not torch.allclose(model(ids, mask, types), model(other, mask, types))


@pytest.mark.parametrize("arch", ["bilstm", "cnn"])
def test_siamese_pair_student_ignores_padding(arch):
    ids, mask, types, sides = _pair_batch()
    model = _student(arch, pairs=True)
    with torch.no_grad():
        padded = model(ids, mask, types)
        alone = torch.cat(
            [
                model(ids[i : i + 1, : a + b], mask[i : i + 1, : a + b], types[i : i + 1, : a + b])
                for i, (a, b) in enumerate(sides)
            ]
        )
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["max", "mean", "last"])
def test_a_bilstm_pair_student_gives_a_pair_with_an_empty_side_the_same_logits_however_padded(pooling):
    wide = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))  # 5 tokens, 7 of padding
    mask = (torch.arange(12) < 5).long().unsqueeze(0)
    no_b = torch.zeros_like(wide)  # every token sentence A's
    model = _student("bilstm", pairs=True, pooling=pooling)
    with torch.no_grad():
        padded = model(wide, mask, no_b)
        alone = model(wide[:, :5], mask[:, :5], no_b[:, :5])
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["bilstm", "cnn"])
def test_siamese_pair_student_classifies_four_matching_features_per_side_width(arch):
    model = _student(arch, pairs=True)
    width = model.hidden.in_features if arch == "bilstm" else model.classifier.in_features
    single = _student(arch)
    single_width = single.hidden.in_features if arch == "bilstm" else single.classifier.in_features
    assert width == 4 * single_width


@pytest.mark.parametrize("arch", ["bilstm", "cnn", "transformer"])
def test_pair_student_without_segments_is_refused(arch):
    ids, mask, _, _ = _pair_batch()
    with pytest.raises(ValueError, match="token_type_ids"):
        _student(arch, pairs=True)(ids, mask)


@pytest.mark.parametrize("arch", ["bilstm", "cnn"])
def test_init_from_teacher_takes_a_gpt_teachers_word_embeddings(arch):
    teacher = GPT2Model(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)).eval()
    student = _student(arch)
    init_from_teacher(student, teacher)
    expected = _teacher_embedding_basis(teacher.wte.weight, student.embed.embedding_dim)
    torch.testing.assert_close(student.embed.weight[1:], expected[1:])


def test_init_from_teacher_refuses_a_transformer_student_of_a_gpt_teacher():
    teacher = GPT2Model(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)).eval()
    with pytest.raises(TypeError, match="BERT teacher"):
        init_from_teacher(_student("transformer"), teacher)


def _extension(monkeypatch, cls, **overrides) -> Student:
    """A `cls` student built by `build_student`, registered in `ARCHITECTURES` as docs/extending.md says (under an
    arch name the config lists already: the config's list is fixed when it is defined)."""
    monkeypatch.setitem(ARCHITECTURES, "cnn", cls)
    return _student("cnn", **overrides)


@pytest.mark.parametrize("pairs", [False, True])
def test_a_student_added_as_the_docs_say_keeps_the_contract(monkeypatch, pairs):
    check_student(_extension(monkeypatch, extension.BagOfWords, pairs=pairs), from_teacher=True)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pairs", [False, True])
def test_every_student_keeps_the_contract(arch, pairs):
    check_student(_student(arch, pairs=pairs), from_teacher=True)


@pytest.mark.parametrize(
    ("cls", "pairs", "message"),
    [
        (extension.TwoArguments, False, r"forward must take \(input_ids, attention_mask, token_type_ids=None\)"),
        (extension.TypesRequired, False, r"forward must take \(input_ids, attention_mask, token_type_ids=None\)"),
        (extension.OneLogit, False, r"returns \(2,\) for 2 texts; want logits \(batch, num_labels\) = \(2, 2\)"),
        (extension.ReadsPadding, False, "padded text differ from those of the same text alone"),
        (extension.ReadsPadding, True, "padded text differ from those of the same text alone"),
        (extension.NoPairs, True, "do not depend on token_type_ids, but this task's texts are pairs"),
        (extension.NoEmbed, False, "init_from_teacher has no rule for NoEmbed"),
    ],
)
def test_a_student_that_breaks_the_contract_is_refused_saying_how(monkeypatch, cls, pairs, message):
    with pytest.raises(StudentError, match=message):
        check_student(_extension(monkeypatch, cls, pairs=pairs), from_teacher=True)


def test_a_student_init_from_teacher_has_no_rule_for_passes_when_it_starts_afresh(monkeypatch):
    check_student(_extension(monkeypatch, extension.NoEmbed), from_teacher=False)


def test_an_arch_without_a_class_is_refused_naming_the_registry(monkeypatch):
    monkeypatch.delitem(ARCHITECTURES, "cnn")
    with pytest.raises(StudentError, match="'cnn' has no class in distill.students.ARCHITECTURES"):
        _student("cnn")


def test_loading_a_saved_student_prints_nothing(tmp_path, capsys):
    _student("cnn").save_pretrained(tmp_path)
    Student.from_pretrained(tmp_path)
    assert capsys.readouterr().out == ""
