"""What `python -m distill <stage>` runs, in order: the stages a stage needs first, and the rules for torchrun and
parallel jobs."""

from collections.abc import Sequence
from pathlib import Path

from edgedistill.common import manifest as mf
from edgedistill.common.data import DataError, load_splits, load_test, unlabelled_lines, unreadable_files
from edgedistill.common.names import first_of, nearest_beside
from edgedistill.common.recipe import Recipe, RecipeError, run_dir
from edgedistill.distill import device, dist, heads, parallel, pretrain, stages, student_stage, table
from edgedistill.distill.tokenization import load_tokenizer, mask_token, pair_segments
from edgedistill.distill.transfer import labelling_placement
from transformers import AutoConfig

# The files a checkpoint folder's weights are read from, whole or sharded
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
CALIBRATION_LINES = 100  # unlabelled lines past the transfer set's that a cascade's 100 texts at least may need


def run(
    recipe: Recipe,
    recipe_file: str,
    stage: str,
    only: list[str] | None = None,
    jobs: int = 1,
    force: bool = False,
    baselines: bool = True,
    overrides: Sequence[str] = (),
) -> None:
    """Run `stage` of `recipe` (read from `recipe_file`, which messages name, with the recipe `overrides` the command
    was given, which the table's note names) with what it needs first; `force` rebuilds the stage asked for. A recipe
    or launch that cannot run it raises `RecipeError`."""
    placement = device.for_process(recipe.runtime)
    dist.init(placement.device.type, recipe.runtime.collective_timeout_s)
    try:
        dist.check_shared(run_dir(recipe))
        dist.check_same_precision(placement.name, placement.precision)
        if dist.is_main():
            p = placement.describe()
            print(
                f"[runtime] {p['device']} ({p['device_name']}), {_precision(recipe, stage, placement)}, "
                f"{dist.world_size()} process(es)"
            )
            if slow := device.emulation_warning(placement):
                print(f"[runtime] warning: {slow}")
        if stage in ("pretrain", "finetune", "teacher"):
            _require_checkpoint(recipe.model.init)
            if dist.is_main():
                _warn_unreadable_transfer_files(recipe)
                _warn_cascade_calibration(recipe)
                _warn_masking(recipe)
                _warn_student_problems(recipe)
                _warn_positions(recipe)
            _teacher(recipe, recipe_file, stage, force)
        elif stage in ("transfer", "distill"):
            _transfer_and_students(recipe, recipe_file, stage, only, jobs, force, baselines, overrides)
    finally:
        dist.shutdown()


def _precision(recipe: Recipe, stage: str, placement: device.Placement) -> str:
    """The precision `stage` runs in (`placement`'s): the transfer set is labelled in `labelling_placement`'s (bf16
    where `auto` trains in fp32 on a CPU that computes bf16 natively); `distill`, which labels it first where it is
    stale, names both where they differ."""
    if stage not in ("transfer", "distill") or recipe.transfer is None:  # the stage says what the recipe lacks
        return placement.precision
    labelling = labelling_placement(recipe).precision
    if stage == "transfer":
        return labelling
    if labelling != placement.precision:
        return f"{placement.precision} ({labelling} to label the transfer set)"
    return placement.precision


def _warn_unreadable_transfer_files(recipe: Recipe) -> None:
    """Say now, not after the teacher has trained, that the transfer stage cannot read a file it reads (missing, not
    UTF-8, not gzip data, or empty), from the file's first text line."""
    for err in unreadable_files(recipe.transfer.unlabelled_files if recipe.transfer is not None else []):
        print(f"[teacher] warning: transfer.unlabelled_files: {err}; the transfer stage will stop on it")


def _warn_cascade_calibration(recipe: Recipe) -> None:
    """Say now, not after the teacher, transfer set and students are built, that the cascades' calibration may find
    too few texts: it reads the unlabelled lines past the transfer set's, and fewer than `CALIBRATION_LINES` of them
    may hold fewer than the texts it needs; the fix, once the transfer set is built, labels it again."""
    if recipe.export is None or not recipe.export.cascades or recipe.transfer is None:
        return
    cfg = recipe.transfer
    if any(source.startswith("hub:") for source in cfg.unlabelled_files):
        return
    # lines holding text, as the transfer set and the calibration count them (a blank one is neither's)
    wanted = cfg.unlabelled_max_lines + CALIBRATION_LINES
    try:
        lines = sum(1 for _ in unlabelled_lines(cfg.unlabelled_files, wanted))
    except DataError:  # `_warn_unreadable_transfer_files` says so
        return
    if (past := lines - cfg.unlabelled_max_lines) >= CALIBRATION_LINES:
        return
    print(
        f"[teacher] warning: export.cascades calibrate on the lines of transfer.unlabelled_files past the transfer "
        f"set's {cfg.unlabelled_max_lines} (transfer.unlabelled_max_lines), and they have {max(past, 0)}: the cascade "
        "build may find too few texts; lower unlabelled_max_lines or add text now, as changing either once the "
        "transfer set is built labels it again and trains every student again"
    )


def _warn_masking(recipe: Recipe) -> None:
    """Say now, not after the teacher has trained, that the transfer stage will refuse to mask words with the
    tokenizer of `model.init` (a scratch tokenizer is trained with a mask token of its own)."""
    if recipe.transfer is None or recipe.model.init is None:
        return
    try:
        mask_token(load_tokenizer(recipe.model.init), recipe.transfer.masks)
    except RecipeError as err:
        print(f"[teacher] warning: {err}; the transfer stage will stop on it")


def _warn_student_problems(recipe: Recipe) -> None:
    """Say now, not after the teacher has trained, that the transfer and distill stages will refuse a student of the
    recipe: each checks the students before it builds the transfer set."""
    if recipe.distill is None:
        return
    try:
        student_stage.check_students(recipe, list(recipe.distill.students))
    except RecipeError as err:
        print(f"[teacher] warning: {err}; the transfer and distill stages will stop on it, before the transfer set")


def _require_checkpoint(init: str | None) -> None:
    """A local `model.init` that is no checkpoint folder (missing, a file, or a folder without `config.json` or any of
    `WEIGHT_FILES`) is a `RecipeError` naming what it is, rather than the loader's guess that it is a Hub name or its
    traceback."""
    if not init:
        return
    path = Path(init)
    if mf.gone(init):
        raise RecipeError(
            f"model.init: {init} not found{nearest_beside(path)}: name a checkpoint folder, or a Hub model "
            "(EDGEDISTILL_TEACHER_INIT for the shipped recipes)"
        )
    if not path.exists():  # a Hub name
        return
    if not path.is_dir():
        raise RecipeError(
            f"model.init: {path} is a file, not a checkpoint folder: name the folder that holds config.json and the "
            "weights (EDGEDISTILL_TEACHER_INIT for the shipped recipes)"
        )
    if not (path / "config.json").is_file():
        held = sorted(item.name for item in path.iterdir())
        holds = f"it holds {first_of(held)}" if held else "it is empty"
        raise RecipeError(
            f"model.init: {path} holds no checkpoint (no config.json; {holds}): name the folder a model's "
            "save_pretrained wrote, or a Hub model (EDGEDISTILL_TEACHER_INIT for the shipped recipes)"
        )
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise RecipeError(
            f"model.init: {path} holds no weights (none of {', '.join(WEIGHT_FILES)}), only config.json: name the "
            "folder a model's save_pretrained wrote, or a Hub model (EDGEDISTILL_TEACHER_INIT for the shipped recipes)"
        )


def _warn_positions(recipe: Recipe) -> None:
    """Say now, not after the teacher has trained, that the transfer stage will refuse a `transfer.max_length` past the
    teacher's positions: those of `model.init`, or `pretrain.scratch_positions` for a teacher built from scratch."""
    if recipe.transfer is None:
        return
    tokens, setting = recipe.transfer.max_length, "transfer.max_length"
    try:
        if recipe.model.init is None:
            positions = pretrain.scratch_positions(recipe.model, recipe.pretrain.seq_len)
            why = "512, model.max_length or pretrain.seq_len, whichever is most"
            heads.refuse_past_positions(positions, tokens, setting, "a teacher built from scratch", why)
        else:
            heads.require_positions(AutoConfig.from_pretrained(recipe.model.init), tokens, setting, recipe.model.init)
    except RecipeError as err:
        print(f"[teacher] warning: {err}; the transfer stage will stop on it")
    except (OSError, ValueError):  # an init whose config cannot be read (a RecipeError is one too): fine-tuning says so
        return


def _teacher(recipe: Recipe, recipe_file: str, stage: str, force: bool) -> None:
    """`pretrain`, `finetune`, or `teacher`: pretraining where the recipe has it, then fine-tuning."""
    planned = stages.of_command(recipe, recipe_file, stage)
    if stage == "teacher" and planned[0].name == "pretrain":
        # pretraining reads no labelled data: a wrong column or label fails now, not after it
        load_splits(recipe.data)
        load_test(recipe.data)
        if recipe.data.pairs and recipe.model.init:  # nor a pair task's tokenizer: pretraining keeps the init's
            pair_segments(load_tokenizer(recipe.model.init), recipe.model.init)
    for planned_stage in planned:
        dist.run_stage(planned_stage, force)


def _transfer_and_students(
    recipe: Recipe,
    recipe_file: str,
    stage: str,
    only: list[str] | None,
    jobs: int,
    force: bool,
    baselines: bool,
    overrides: Sequence[str],
) -> None:
    """`transfer`, or `distill`: the transfer set (labelled in one process, so under torchrun it must be built
    already), then the students and their baselines, then the table."""
    transfer = stages.of_command(recipe, recipe_file, stage)[0]  # a recipe without the sections fails here
    if jobs > 1 and dist.world_size() > 1:  # the processes of torchrun train each student together, one at a time
        raise RecipeError(
            f"--jobs {jobs} trains students in parallel processes of one launch, and torchrun already runs "
            f"{dist.world_size()} processes training each student together: drop --jobs (make: NPROC=1 for JOBS)"
        )
    runs = stages.students(recipe, recipe_file, only, baselines)
    # A student class that breaks the contract fails now, not after the transfer set or in training.
    student_stage.check_students(recipe, list(dict.fromkeys(name for name, _ in runs)))
    single = dist.world_size() == 1
    if stage == "transfer":
        if not single:
            raise RecipeError(
                "the transfer set is labelled in one process: run `edgedistill labeller "
                f"{recipe_file} && edgedistill transfer {recipe_file}` (make transfer in a checkout) without torchrun"
            )
        transfer.run(force)
        return
    if single:
        transfer.run()
    elif not transfer.is_current():
        raise RecipeError(
            f"the transfer set is labelled in one process: run `edgedistill labeller {recipe_file} && edgedistill "
            f"transfer {recipe_file}` (make transfer in a checkout) before distilling under torchrun"
        )
    if jobs > 1 and single:
        parallel.run_all(recipe, runs, jobs, force=force)
    else:
        for name, baseline in runs:
            dist.run_stage(stages.student(recipe, name, baseline), force)
    if dist.is_main():
        table.write(recipe, overrides)
