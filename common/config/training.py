"""The recipe sections of training: the task data, the teacher, its pretraining and fine-tuning, the transfer set,
the students, and where training runs."""

import unicodedata
from typing import Literal

from edgedistill.common.config.strict import Name, Strict
from edgedistill.common.names import did_you_mean
from edgedistill.common.text import shows_nothing
from edgedistill.common.textstyle import Style
from pydantic import BaseModel, Field, PositiveInt, ValidationInfo, field_validator, model_validator

Metric = Literal["accuracy", "macro_f1", "f1"]
METRIC_NAMES: dict[str, str] = {"accuracy": "accuracy", "macro_f1": "macro-F1", "f1": "F1"}
LABELLED_FORMATS = (".csv", ".tsv", ".jsonl")
NOT_PLAIN_TEXT = (*LABELLED_FORMATS, ".json")  # what a text file's line-by-line reading would take syntax and all
UNQUOTED = "YAML reads yes/no/true/false/on/off, null and bare numbers as other types"


def plain_text_files(section: str, files: list[str], info: ValidationInfo) -> list[str]:
    """`files`, refused where one is in a labelled-data format or JSON: text files are read line by line, each line a
    text, so a header, quoting or JSON syntax would become text."""
    for name in files:
        if suffix := next((s for s in NOT_PLAIN_TEXT if name.lower().removesuffix(".gz").endswith(s)), None):
            raise ValueError(
                f"{section}.{info.field_name}: {name} would be read line by line as plain text, its {suffix} syntax "
                "and all; write its texts to a text file, one per line"
            )
    return files


def _shown(name: str) -> str:
    """A label name as it looks: accents composed (NFC), format characters such as a zero-width space left out."""
    return "".join(char for char in unicodedata.normalize("NFC", name) if unicodedata.category(char) != "Cf")


def yaml_word(value: bool, likely: tuple[str, ...] = ()) -> str:
    """A word YAML 1.1 reads as the boolean `value`, for a hint to quote it: the first of `likely` that it reads so
    (`no` among label names yes/no, where `value` is False), else on or off."""
    words = ("yes", "on", "true") if value else ("no", "off", "false")
    cased = (str.lower, str.title, str.upper)  # YAML reads `no`, `No` and `NO`, not `nO`
    return next((word for word in likely if any(word == case(known) for known in words for case in cased)), words[1])


def quoted(key: str, written: str) -> str:
    """How to give the dotted `key` the YAML `written` (quoted text, or a list of it), in a recipe and on the command
    line, where the shell would drop the quotes of `--key="yes"`."""
    return f"{key.rpartition('.')[2]}: {written} in a recipe, --{key}='{written}' on the command line"


class DataConfig(Strict):
    """Labelled task data: a local TSV/CSV/JSONL file or `hub:<dataset>[@<config>]:<split>`."""

    train: str
    dev: str
    test: str | None = Field(None, description="a labelled test split: evaluated once, on the kept checkpoints")
    text_column: str = "sentence"
    text_pair_column: str | None = None
    label_column: str = Field("label", description="the label's column: a name from label_names, or its index")
    label_names: list[str] = Field(
        min_length=2,
        description="the task's labels in index order (label 0 first); their number is the number of classes",
    )
    metric: Metric = Field(
        "accuracy",
        description="the dev metric that selects checkpoints: accuracy, macro_f1 (F1 averaged over the labels) or "
        "f1 (F1 of positive_label)",
    )
    positive_label: str | None = Field(
        None,
        description="the label whose F1 is reported as f1; default: the second label of a binary task",
    )
    symmetric_pairs: bool = Field(
        False,
        description="the label does not depend on the order of the two texts (paraphrase, similarity): every "
        "labelled train pair is also used the other way round",
    )
    train_limit: int | None = Field(None, gt=0)
    dev_limit: int | None = Field(None, gt=0)
    hashed_when_set = frozenset({"symmetric_pairs"})

    @model_validator(mode="before")
    @classmethod
    def _label_names_listed(cls, data):
        if not isinstance(data, dict):
            return data
        if "label_names" not in data:
            raise ValueError(
                "data.label_names is missing: list the task's label names in the recipe, in index order "
                "(label 0 first), e.g. label_names: [negative, positive]"
            )
        names = data["label_names"]
        unquoted = [name for name in names if not isinstance(name, str)] if isinstance(names, list) else []
        if unquoted:
            raise ValueError(
                f'data.label_names: {unquoted} are not names: {UNQUOTED}; quote them (["1", "2"] for numbers), e.g. '
                + quoted("data.label_names", '["no", "yes"]')
            )
        return data

    @field_validator("text_column", "text_pair_column", "label_column", "positive_label", mode="before")
    @classmethod
    def _names_quoted(cls, value, info: ValidationInfo):
        if value is None and info.field_name in ("text_column", "label_column"):
            raise ValueError(
                f"data.{info.field_name} is empty: name the {info.field_name.removesuffix('_column')} column "
                f'(quoted where it starts with #, e.g. {info.field_name}: "#1 String")'
            )
        if isinstance(value, bool | int | float):
            names = info.data.get("label_names", []) if info.field_name == "positive_label" else []
            example = yaml_word(value, (*names, "yes", "no")) if isinstance(value, bool) else value
            key, written = f"data.{info.field_name}", f'"{example}"'
            raise ValueError(f"{key}: {value!r} is not a name: {UNQUOTED}; quote it, e.g. {quoted(key, written)}")
        return value

    @field_validator("label_names")
    @classmethod
    def _label_names_servable(cls, names: list[str]) -> list[str]:
        # A label cell is read stripped, and the server answers with the name, one line each in a Triton labels.txt.
        for name in names:
            if shows_nothing(name):
                raise ValueError(
                    f"data.label_names: {name!r} is no name (empty, or spaces or invisible characters only): the "
                    "server answers with each label's name, so give every label one"
                )
            if name != name.strip():
                raise ValueError(
                    f"data.label_names: {name!r} has spaces around it, which a label cell is read without, so no "
                    f"cell could name it: write {name.strip()!r}"
                )
            if any(unicodedata.category(char) in ("Cc", "Zl", "Zp") for char in name):
                raise ValueError(
                    f"data.label_names: {name!r} holds a line break or another control character: a served label "
                    "name is one line (a Triton repository's labels.txt holds one name a line)"
                )
        return names

    @model_validator(mode="after")
    def _labels_and_metric(self):
        # names equal once accents are composed (NFC) are one name to the data reader, and look alike when served, as
        # do names apart only by a format character (a zero-width space)
        shown = [_shown(name) for name in self.label_names]
        if repeated := sorted({name for name in shown if shown.count(name) > 1}):
            raise ValueError(
                f"data.label_names lists {repeated} more than once (as names look: accents composed, zero-width "
                "characters left out)"
            )
        if self.positive_label is not None and self.positive_index is None:
            raise ValueError(
                f"data.positive_label={self.positive_label!r} is not one of data.label_names {self.label_names}: set "
                "it to one of them"
                + (", or to null for the default: the second of two labels" if len(self.label_names) == 2 else "")
            )
        columns = {"text_column": self.text_column, "label_column": self.label_column}
        if self.text_pair_column is not None:
            columns["text_pair_column"] = self.text_pair_column
        shared = {name: [key for key, value in columns.items() if value == name] for name in columns.values()}
        if clash := next((keys for keys in shared.values() if len(keys) > 1), None):
            # one column read twice: a pair of the same text, or a label read as text, would train without an error
            raise ValueError(
                f"data.{' and data.'.join(clash)} both name the column {columns[clash[0]]!r}; each names its own column"
            )
        if self.symmetric_pairs and self.text_pair_column is None:
            raise ValueError("data.symmetric_pairs needs data.text_pair_column: only pairs have an order to swap")
        if self.metric == "f1" and self.positive_index is None:
            raise ValueError(
                f"data.metric=f1 needs data.positive_label: a task of {self.num_labels} labels has no default "
                f"positive class; name one of {self.label_names}, or use metric: macro_f1"
            )
        return self

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def positive_index(self) -> int | None:
        """The class whose F1 is `f1`: `positive_label`, else the second of two labels; None for more labels."""
        if self.positive_label is not None:  # accents composed or not, as the data reader matches a label cell
            composed = [unicodedata.normalize("NFC", name) for name in self.label_names]
            named = unicodedata.normalize("NFC", self.positive_label)
            return composed.index(named) if named in composed else None
        return 1 if self.num_labels == 2 else None

    @property
    def pairs(self) -> bool:
        """Whether every example is a sentence pair (`text_pair_column` set)."""
        return self.text_pair_column is not None

    @property
    def selection_key(self) -> str:
        """The dev figure that selects checkpoints (`metric`): `dev_accuracy`, `dev_macro_f1` or `dev_f1`."""
        return f"dev_{self.metric}"

    @property
    def dev_keys(self) -> list[str]:
        """The dev figures a table or a summary line shows: `dev_accuracy`, the selection metric when it is another,
        then whatever the selection metric, those that fit the task: `dev_macro_f1` for more than two labels, `dev_f1`
        for a task with a positive class (`positive_index`)."""
        fitting = ["dev_macro_f1"] if self.num_labels > 2 else []
        fitting += ["dev_f1"] if self.positive_index is not None else []
        return list(dict.fromkeys(["dev_accuracy", self.selection_key, *fitting]))

    def figure_keys(self, test: bool) -> list[str]:
        """The figures a table shows: `dev_keys`, then, with `test` (a manifest carries test figures), their test
        twins."""
        return self.dev_keys + ([key.replace("dev_", "test_", 1) for key in self.dev_keys] if test else [])


SCRATCH = frozenset({"vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "dropout"})


class ModelConfig(Strict):
    """The teacher: `init` is a local folder or a Hub name; `null` builds it from scratch."""

    family: Literal["bert", "gpt"] = "bert"
    init: str | None = Field(None, min_length=1)
    max_length: int = Field(128, ge=8)
    # Sizes for a model built from scratch (`SCRATCH`: ignored when `init` is set, as the checkpoint sizes it).
    vocab_size: int = Field(8000, ge=100)
    hidden_size: int = Field(256, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(1024, ge=8)
    dropout: float = Field(0.1, ge=0, lt=1)

    def unread(self) -> frozenset[str]:
        """Under `init`, the sizes of a model built from scratch: a base recipe's (`extends: smoke`) then make no
        stage stale, as the shipped recipes with an `init` keep their defaults."""
        return super().unread() | (SCRATCH if self.init is not None else frozenset())

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.init is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}"
            )
        return self


class OptimConfig(Strict):
    """AdamW with linear warm-up and decay; evaluation and checkpoint cadence in steps."""

    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(
        None,
        gt=0,
        description="the step budget (optimizer steps), in place of epochs: where it is set, epochs is not read, and "
        "changing epochs builds nothing again",
    )
    batch_size: int = Field(
        32, ge=1, description="examples per optimizer step, whatever the number of processes (split among them)"
    )
    grad_accum: int = Field(
        1,
        ge=1,
        description="micro-batches per optimizer step and process, for models whose batch does not fit; not hashed "
        "(a checkpoint resumes under another value)",
    )
    grad_clip: float = Field(1.0, gt=0)
    eval_every: int | None = Field(None, gt=0, description="also evaluate every N steps")
    checkpoint_every: int = Field(200, gt=0)
    patience: int | None = Field(None, gt=0, description="evaluations without improvement before stopping")
    layer_decay: float | None = Field(
        None, gt=0, le=1, description="learning rate x this factor per layer further from the head"
    )
    ema_decay: float | None = Field(
        None, gt=0, lt=1, description="evaluate and keep an exponential moving average of the weights"
    )
    seed: int = 13
    # how a step's batch is split: the steps stay the same (`checkpoint_every` stays hashed: the shipped sst2-gpt
    # recipe sets it, and leaving it out would make its existing runs stale)
    hashed_as_default = frozenset({"grad_accum"})

    def unread(self) -> frozenset[str]:
        """Where `max_steps` is the step budget, `epochs`, which training then does not read: changing it builds
        nothing again (the shipped recipes that set `max_steps` leave `epochs` at its default, which keeps their
        hashes)."""
        return super().unread() | ({"epochs"} if self.max_steps is not None else frozenset())


class WithPresets(Strict):
    """A section whose sections default to a preset (`optim: OptimConfig = OptimConfig(lr=1e-4)`): a mapping given for
    one, in a recipe or by dotted overrides, sets its keys over the preset, so the keys it leaves out keep the preset's
    values rather than their section's defaults."""

    @model_validator(mode="before")
    @classmethod
    def _over_the_presets(cls, data):
        if not isinstance(data, dict):
            return data
        return data | {
            name: field.default.model_dump(exclude_unset=True) | data[name]
            for name, field in cls.model_fields.items()
            if isinstance(field.default, BaseModel) and isinstance(data.get(name), dict)
        }


class PretrainConfig(WithPresets):
    """Masked-LM (BERT) or causal-LM (GPT) pretraining, from scratch or continued from `model.init`."""

    train_files: list[str] = Field(min_length=1)
    eval_files: list[str] = Field(default_factory=list, description="empty: hold out the last train lines")
    eval_holdout_lines: int = Field(500, gt=0)
    train_max_lines: int | None = Field(None, gt=0)
    eval_max_lines: int | None = Field(
        None,
        gt=0,
        description="read at most this many lines of eval_files; with eval_files empty, not read, and changing it "
        "builds nothing again",
    )
    seq_len: int = Field(128, ge=8)
    mlm_probability: float = Field(0.15, gt=0, lt=1)
    whole_word_mask: bool = False
    optim: OptimConfig = OptimConfig(lr=1e-4)

    @field_validator("train_files", "eval_files")
    @classmethod
    def _plain_text(cls, files: list[str], info: ValidationInfo) -> list[str]:
        return plain_text_files("pretrain", files, info)

    def unread(self) -> frozenset[str]:
        """With `eval_files` empty, `eval_max_lines`, which evaluation then does not read (the shipped recipes that
        hold out train lines leave it at its default, which keeps their hashes)."""
        return super().unread() | (frozenset() if self.eval_files else {"eval_max_lines"})

    @model_validator(mode="after")
    def _holdout_without_eval_files(self):
        if self.eval_files and "eval_holdout_lines" in self.model_fields_set:
            raise ValueError(
                "eval_holdout_lines holds out the last train lines only where eval_files is empty, and it is not "
                "(evaluation reads eval_files): drop one of the two"
            )
        return self


class FinetuneConfig(Strict):
    """Sequence classification on the labelled task; the best dev checkpoint is kept."""

    optim: OptimConfig = OptimConfig()
    classifier_dropout: float | None = Field(None, ge=0, lt=1)
    reinit_layers: int = Field(
        0, ge=0, description="top Transformer layers (and the pooler) initialised afresh instead of from the init"
    )
    pooling: Literal["cls", "mean"] = Field(
        "cls",
        description="what the classifier reads: `cls`, the family's own head (BERT's [CLS] pooler, GPT's last "
        "token); `mean`, the final states averaged over real tokens (bert only), as sentence-embedding "
        "checkpoints were trained",
    )
    hashed_when_set = frozenset({"reinit_layers", "pooling"})


AUGMENTATION = frozenset({"max_augmented", "p_mask", "p_replace", "p_ngram"})


class TransferConfig(Strict):
    """The transfer set: unlabelled sentences plus Tang et al. augmentations of the train inputs."""

    unlabelled_files: list[str] = Field(min_length=1)
    unlabelled_max_lines: int | None = Field(
        None,
        gt=0,
        description="raw lines (reviews) to read; unset: every line, their sentences all held in memory (refused "
        "with `export.cascades`, which calibrate on the lines past these)",
    )
    max_unlabelled: int | None = Field(None, gt=0, description="sentences kept, drawn from every line read")
    include_train: bool = True
    n_iter: int = Field(
        20,
        ge=0,
        description="augmented samples drawn per train example; at 0, max_augmented, p_mask, p_replace and p_ngram "
        "are not read, and changing one builds nothing again",
    )
    max_augmented: int | None = Field(None, gt=0)
    p_mask: float = Field(0.1, ge=0, le=1)
    p_replace: float = Field(0.1, ge=0, le=1)
    p_ngram: float = Field(0.25, ge=0, le=1)
    text_style: Style = Field(
        "raw",
        description="how every transfer-set text (unlabelled, train, augmented) is written: as given, or "
        "lower-cased and PTB-tokenised like SST-2; bundles record it, and their server writes each text in it",
    )
    max_length: int = Field(
        64, ge=8, description="tokens per example (both sides of a pair), for labelling and students"
    )
    shard_size: int = Field(50_000, gt=0)
    label_batch_size: int = Field(128, gt=0, description="sentences per labelling batch (length-sorted)")
    labeller: str | None = Field(
        None,
        description="on the CPU, label with this fp32 or INT8 teacher bundle in ONNX Runtime (built first by "
        "`edgedistill labeller`; its providers `CPUExecutionProvider` alone) instead of PyTorch; on a GPU, PyTorch "
        "labels",
    )
    relabel_margin: float | None = Field(
        None,
        gt=0,
        description="with an INT8 labeller (and only then): every text whose INT8 margin (the gap between its two "
        "highest logits) is below this is labelled again by the teacher in PyTorch, in the labelling precision",
    )
    precision_check_sentences: int = Field(
        5000,
        gt=0,
        description="labelled in bf16/fp16 or by an INT8 labeller, this many, evenly spaced over the whole set, are "
        "labelled again in fp32 and compared",
    )
    tie_margin: float = Field(
        0.1,
        ge=0,
        description="a checked text whose fp32 logits' top two are closer than this is a near-tie: a label that "
        "differs from fp32's there but whose fp32 logit is this close to the top is counted (`fp32_tie_flips`) "
        "but does not count against min_agreement",
    )
    min_agreement: float = Field(
        0.999,
        gt=0,
        le=1,
        description="labels made by an INT8 labeller (always) or in bf16/fp16 (with runtime.precision auto; an "
        "explicit one keeps its labels, with a warning) that agree with fp32 on fewer of the checked sentences than "
        "this, near-ties aside, are made again in fp32",
    )
    seed: int = 13

    @field_validator("unlabelled_files")
    @classmethod
    def _plain_text(cls, files: list[str], info: ValidationInfo) -> list[str]:
        return plain_text_files("transfer", files, info)

    def unread(self) -> frozenset[str]:
        """Where `n_iter` draws no sample, the settings of the samples (`AUGMENTATION`)."""
        return super().unread() | (AUGMENTATION if not self.n_iter else frozenset())

    @property
    def masks(self) -> float:
        """The share of words augmentation masks: `p_mask`, or 0 where `n_iter` draws no sample."""
        return self.p_mask if self.n_iter else 0.0

    @model_validator(mode="after")
    def _probabilities(self):
        if self.p_mask + self.p_replace > 1:
            raise ValueError(f"transfer.p_mask + transfer.p_replace = {self.p_mask + self.p_replace} exceeds 1")
        if self.n_iter and not (self.p_mask or self.p_replace or self.p_ngram):
            raise ValueError(
                f"transfer.n_iter={self.n_iter} draws samples that p_mask, p_replace and p_ngram, all 0, leave "
                "equal to their train example, so none is kept: set n_iter: 0 for no augmentation, or a probability "
                "above 0"
            )
        return self


# What the student stage sets on a student's config from the data and the teacher, whatever a recipe says.
STUDENT_FROM_DATA = frozenset({"vocab_size", "num_labels", "pad_token_id", "max_length", "pairs"})
# The settings each architecture reads (`distill.students`); the BiLSTM's num_layers may only be 1.
ARCH_SETTINGS = {
    "bilstm": frozenset({"embed_dim", "hidden_size", "num_layers", "dropout", "pooling"}),
    "cnn": frozenset({"embed_dim", "kernel_sizes", "num_filters", "dropout"}),
    "transformer": frozenset({"hidden_size", "num_layers", "num_heads", "intermediate_size", "dropout"}),
}


class StudentConfig(Strict):
    """Architecture and sizes of a student; a recipe that sets one its architecture does not read
    (`ARCH_SETTINGS`) is refused (`DistillConfig`)."""

    arch: Literal["bilstm", "cnn", "transformer"]
    vocab_size: int | None = Field(None, gt=0, description="set from the teacher's tokenizer")
    num_labels: int = Field(2, ge=2, description="classes (set from the data)")
    embed_dim: int = Field(300, gt=0, description="word vectors of bilstm/cnn; the transformer uses hidden_size")
    hidden_size: int = Field(300, gt=0, description="LSTM units per direction / transformer width")
    num_layers: int = Field(1, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(1200, gt=0)
    kernel_sizes: list[PositiveInt] = Field(default_factory=lambda: [3, 4, 5], min_length=1)
    num_filters: int = Field(100, gt=0)
    dropout: float = Field(0.1, ge=0, lt=1)
    pooling: Literal["max", "mean", "last"] = "max"
    pairs: bool = Field(False, description="set from the data: takes sentence pairs (token_type_ids mark sentence B)")
    max_length: int = Field(128, gt=0, description="tokens per text (set from transfer.max_length)")
    pad_token_id: int = Field(0, ge=0, description="the padding token (set from the teacher's tokenizer)")

    @model_validator(mode="after")
    def _consistent(self):
        if self.arch == "transformer" and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.arch == "bilstm" and self.num_layers != 1:
            # Padding invariance without packed sequences (see BiLSTMClassifier) holds for one layer only.
            raise ValueError(f"bilstm supports num_layers=1, got {self.num_layers}")
        if self.vocab_size is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(f"pad_token_id={self.pad_token_id} is outside vocab_size={self.vocab_size}")
        return self


class LossWeights(Strict):
    """Weights of the distillation terms: a weight of 0 skips the term (see `distill.losses`)."""

    kd: float = Field(0.0, ge=0, description="soft-target KL at the temperature, times T^2 (Hinton)")
    mse: float = Field(1.0, ge=0, description="logit MSE (Tang et al.)")
    ce: float = Field(0.0, ge=0, description="hard-label cross-entropy where a label exists")
    hidden: float = Field(0.0, ge=0, description="hidden-state MSE (transformer students)")
    attention: float = Field(0.0, ge=0, description="attention KL (transformer students)")

    @model_validator(mode="after")
    def _some_term(self):
        if not any(self.model_dump().values()):
            raise ValueError(
                "every loss weight is 0, so the student would learn nothing: give a term a weight (mse: 1)"
            )
        return self

    @model_validator(mode="after")
    def _a_term_reaches_the_classifier(self):
        if (given := self.layered) and not (self.kd or self.mse or self.ce):
            raise ValueError(
                f"{' and '.join(given)} alone would train the student's layers, not its classifier, which would stay "
                "random: give kd, mse or ce a weight (mse: 1)"
            )
        return self

    @property
    def layered(self) -> list[str]:
        """The weighted terms that compare a transformer student's layers with the teacher's: the student stage runs
        the teacher in training for them, and they need a transformer student and a teacher with one layer stack."""
        return [term for term in ("hidden", "attention") if getattr(self, term)]


class StudentRun(WithPresets):
    """One student: its architecture, optimizer and losses; the baseline reuses all but the losses."""

    model: StudentConfig
    optim: OptimConfig = OptimConfig(lr=1e-3, batch_size=64)
    losses: LossWeights = LossWeights()
    temperature: float = Field(2.0, gt=0)
    init_from_teacher: bool = Field(True, description="teacher embeddings (and layers, for a transformer)")
    baseline_init_from_teacher: bool = Field(
        False, description="start the label-only baseline from the teacher too (off: it sees nothing of the teacher)"
    )

    @model_validator(mode="after")
    def _temperature_needs_the_soft_targets(self):
        if "temperature" in self.model_fields_set and not self.losses.kd:
            raise ValueError(
                f"temperature={self.temperature:g} would change nothing: only the kd loss reads it, and losses.kd is 0 "
                "(remove temperature, or weigh losses.kd)"
            )
        return self

    @model_validator(mode="after")
    def _intermediate_losses_need_a_transformer(self):
        if (given := self.losses.layered) and self.model.arch != "transformer":
            raise ValueError(
                f"losses {given} compare the teacher's layers with a transformer student's; a {self.model.arch} "
                "student has none: set them to 0"
            )
        return self

    @model_validator(mode="after")
    def _layer_decay_needs_a_transformer(self):
        if self.optim.layer_decay is not None and self.model.arch != "transformer":
            raise ValueError(
                f"optim.layer_decay scales the learning rates of a transformer student's layers; a {self.model.arch} "
                "student has none (it would scale its embedding alone): leave optim.layer_decay unset"
            )
        return self


class DistillConfig(Strict):
    students: dict[Name, StudentRun] = Field(min_length=1)
    deploy: str = Field(
        description="the student `edgedistill headline` reports for a recipe without an `export` section; with one, "
        "`export.deploy` picks what is served, and the headline reports the student that bundle is built from"
    )

    @model_validator(mode="after")
    def _students_set_what_their_arch_reads(self):
        # the student's hash covers every field, so a setting its architecture never reads would still make it stale
        for name, run in self.students.items():
            arch, given = run.model.arch, run.model.model_fields_set - {"arch"} - STUDENT_FROM_DATA
            if arch not in ARCH_SETTINGS:  # an architecture added without its row (docs/extending.md)
                raise ValueError(
                    f"arch {arch!r} has no ARCH_SETTINGS row in common/config/training.py: list the settings it reads"
                )
            if unread := sorted(given - ARCH_SETTINGS[arch]):
                keys = ", ".join(f"distill.students.{name}.model.{key}" for key in unread)
                raise ValueError(
                    f"{keys} would change nothing: a {arch} student reads {', '.join(sorted(ARCH_SETTINGS[arch]))} "
                    f"(remove {keys})"
                )
        return self

    @model_validator(mode="after")
    def _teacher_is_no_students_name(self):
        if "teacher" in self.students:
            raise ValueError(
                "distill.students.teacher: the name is the teacher's (a bundle of source: teacher is built from the "
                "teacher, and the headline reports it as the teacher): give the student another name"
            )
        return self

    @model_validator(mode="after")
    def _deploy_known(self):
        if self.deploy not in self.students:
            raise ValueError(
                f"distill.deploy={self.deploy} is not one of distill.students ({', '.join(self.students)}): "
                f"{did_you_mean(self.deploy, self.students)}name one"
            )
        return self


class RuntimeConfig(Strict):
    """Where training and labelling run, and how long ranks wait for each other: execution choices, not part of any
    hash (the device and precision are recorded in each manifest)."""

    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="auto (CUDA when PyTorch sees a GPU, else the CPU), cpu, cuda, or cuda:N",
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="auto: bf16 on a GPU that has it, else fp16 with a loss scaler; fp32 on the CPU, except "
        "labelling on a CPU with native bf16 (AVX512-BF16 or AMX)",
    )
    collective_timeout_s: int = Field(
        1800,
        gt=0,
        description="under torchrun, the seconds a collective waits before the run fails: the other ranks wait in one "
        "while rank 0 evaluates and writes its checkpoint",
    )
