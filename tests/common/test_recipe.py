import re
from pathlib import Path

import pytest
from edgedistill.common import manifest as mf
from edgedistill.common import settings
from edgedistill.common.config import training
from edgedistill.common.config.export import DYNAMIC_INT8_OPS
from edgedistill.common.config.training import DataConfig, OptimConfig
from edgedistill.common.providers import PROVIDERS
from edgedistill.common.recipe import (
    RecipeError,
    load_command_recipe,
    load_recipe,
    not_an_override,
    overrides_help,
    parse_overrides,
    run_dir,
)
from edgedistill.common.settings import SettingError
from onnxruntime import get_all_providers
from onnxruntime.quantization.registry import IntegerOpsRegistry

from edgedistill import cli

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


MINIMAL = "data: {train: a.tsv, dev: b.tsv, label_names: [negative, positive]}\nmodel: {init: some/model}\n"


def test_shipped_recipes_load():
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        recipe = load_recipe(path)
        assert recipe.name == path.stem
        assert "${" not in recipe.data.train


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda path: path.stem)
def test_a_shipped_recipe_extends_its_sibling_file_whatever_the_working_directory_holds(path):
    """A bare name (`extends: sst2`) would be the working directory's recipes/sst2.yaml first, a user's own."""
    based = [line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("extends:")]
    assert all((path.parent / base).is_file() and base.endswith(".yaml") for base in based)


def test_default_recipe_reads_settings(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "/data/here")
    monkeypatch.setenv("EDGEDISTILL_TEACHER_INIT", "org/model")
    recipe = load_recipe(ROOT / "recipes" / "sst2.yaml")
    assert recipe.data.train == "/data/here/sst2/train.tsv"
    assert recipe.model.init == "org/model"


def test_unknown_key_is_named_with_the_closest_key(tmp_path):
    with pytest.raises(RecipeError, match=r"finetune\.optim\.lrr: unknown key: did you mean lr\? "):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {lrr: 1}}\n"))


def test_unknown_key_lists_what_its_section_takes(tmp_path):
    with pytest.raises(RecipeError, match=r"finetune\.optim takes lr, weight_decay, .*, seed$"):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {speed: 1}}\n"))


def test_an_unknown_key_an_override_gives_names_the_override(tmp_path):
    with pytest.raises(RecipeError, match=r", seed \(--finetune\.optim\.speed on the command line\)$"):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides(["--finetune.optim.speed=1"]))


def test_unknown_key_in_a_named_student_lists_the_students_keys(tmp_path):
    overrides = parse_overrides(["--distill.students.cnn.model.filters=8"])
    with pytest.raises(RecipeError, match=r"did you mean num_filters\? distill\.students\.cnn\.model takes arch, "):
        load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


def test_unknown_key_in_a_students_model_lists_no_key_the_stage_sets(tmp_path):
    overrides = parse_overrides(["--distill.students.cnn.model.filters=8"])
    with pytest.raises(
        RecipeError, match=r"takes arch, embed_dim, hidden_size, num_layers, num_heads, intermediate_size"
    ):
        load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


def test_unknown_top_level_key_offers_extends(tmp_path):
    with pytest.raises(RecipeError, match=r"extend: unknown key: did you mean extends\? a recipe takes name, "):
        load_recipe(write(tmp_path, MINIMAL + "extend: sst2\n"))


def test_an_override_of_a_misspelt_student_names_the_student_meant():
    overrides = parse_overrides(["--distill.students.cnnn.optim.lr=1"])
    with pytest.raises(RecipeError, match=r"distill\.students has no cnnn; did you mean cnn\?\)"):
        load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


def test_an_override_of_a_new_student_unlike_any_lists_the_recipes_students():
    overrides = parse_overrides(["--distill.students.newone.optim.lr=1"])
    message = r"newone\.model: Field required \(the recipe's distill\.students are bilstm, cnn, transformer: "
    with pytest.raises(RecipeError, match=message):
        load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


def test_an_override_that_makes_a_section_the_recipe_lacks_says_so_and_what_the_section_needs(tmp_path):
    message = (
        r"pretrain\.train_files: Field required \(the recipe has no pretrain section: --pretrain\.optim\.lr on the "
        r"command line made one, which needs its train_files\)"
    )
    with pytest.raises(RecipeError, match=message):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides(["--pretrain.optim.lr=1e-4"]))


def test_an_override_that_makes_a_setting_a_section_names_the_override(tmp_path):
    with pytest.raises(RecipeError, match=r"tracking: .* \(--tracking\.foo on the command line made it a section\)$"):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides(["--tracking.foo=1"]))


def test_an_override_that_makes_a_misspelt_section_names_the_override():
    message = (
        r"finetune\.optimizer: unknown key: .* \(--finetune\.optimizer\.lr on the command line made it a section\)$"
    )
    with pytest.raises(RecipeError, match=message):
        load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides(["--finetune.optimizer.lr=1e-4"]))


def test_an_unknown_key_in_a_mapping_an_override_gives_names_the_override(tmp_path):
    with pytest.raises(
        RecipeError, match=r"finetune\.optim\.lrr: unknown key: .* \(--finetune\.optim on the command line\)$"
    ):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides(["--finetune.optim={lrr: 1}"]))


def test_a_misspelt_student_in_a_recipe_file_names_the_student_meant(tmp_path):
    with pytest.raises(RecipeError, match=r"bilsm\.model: Field required \(did you mean bilstm\? the recipe's"):
        load_recipe(write(tmp_path, "extends: smoke\ndistill: {students: {bilsm: {optim: {lr: 0.01}}}}\n"))


def test_a_number_off_its_settings_pattern_says_which_values_there_are_not_to_quote_it(tmp_path):
    with pytest.raises(RecipeError, match=r"runtime\.device: 0 is not valid: give auto .*, cpu, cuda, or cuda:N"):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides(["--runtime.device=0"]))


def test_a_value_off_its_pattern_says_which_values_there_are(tmp_path):
    with pytest.raises(RecipeError, match=r"runtime\.device: 'gpu' is not valid: give auto .*, cpu, cuda, or cuda:N"):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides(["--runtime.device=gpu"]))


def test_wrong_type_is_named(tmp_path):
    with pytest.raises(RecipeError, match=r"finetune\.optim\.batch_size"):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {batch_size: many}}\n"))


def test_a_hidden_size_the_heads_do_not_divide_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="not divisible"):
        load_recipe(
            write(tmp_path, MINIMAL.replace("{init: some/model}", "{init: null, hidden_size: 10, num_heads: 3}"))
        )


def test_heads_that_do_not_divide_the_width_are_not_refused_under_an_init_checkpoint(tmp_path):
    sized = MINIMAL.replace("{init: some/model}", "{init: some/model, hidden_size: 10, num_heads: 3}")
    assert load_recipe(write(tmp_path, sized)).model.init == "some/model"


def test_a_size_of_a_model_from_scratch_off_its_range_is_refused_under_an_init_checkpoint(tmp_path):
    with pytest.raises(RecipeError, match=r"model\.vocab_size: Input should be greater than or equal to 100"):
        load_recipe(write(tmp_path, MINIMAL), {"model.vocab_size": 50})


def test_sizes_of_a_model_from_scratch_leave_the_hash_of_one_from_an_init_checkpoint_unchanged(tmp_path):
    plain = load_recipe(write(tmp_path, MINIMAL))
    sized = load_recipe(write(tmp_path, MINIMAL), {"model.hidden_size": 64, "model.vocab_size": 3000})
    assert plain.section_hash("model") == sized.section_hash("model")


def test_sizes_of_a_model_from_scratch_change_its_hash(tmp_path):
    scratch = MINIMAL.replace("{init: some/model}", "{init: null}") + "pretrain: {train_files: [a.txt]}\n"
    assert load_recipe(write(tmp_path, scratch)).section_hash("model") != load_recipe(
        write(tmp_path, scratch), {"model.hidden_size": 64}
    ).section_hash("model")


def test_a_model_from_scratch_without_a_pretrain_section_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="no `pretrain` section"):
        load_recipe(write(tmp_path, MINIMAL.replace("init: some/model", "init: null")))


def test_a_model_from_scratch_without_a_pretrain_section_is_told_to_add_one_or_set_model_init(tmp_path):
    with pytest.raises(RecipeError, match="add one .*or set model.init to a checkpoint"):
        load_recipe(write(tmp_path, MINIMAL.replace("init: some/model", "init: null")))


def test_overrides_parse_and_apply(tmp_path):
    overrides = parse_overrides(["--finetune.optim.lr=3e-5", "--model.family=gpt", "--name=other"])
    recipe = load_recipe(write(tmp_path, MINIMAL), overrides)
    assert recipe.finetune.optim.lr == 3e-5
    assert recipe.model.family == "gpt"
    assert recipe.name == "other"


def test_an_override_of_null_drops_a_section_as_a_recipe_that_extends_another_does():
    overrides = parse_overrides(["--export.cascades=null"])
    assert load_recipe(ROOT / "recipes" / "smoke.yaml", overrides).export.cascades == {}


def test_an_override_of_null_drops_a_named_bundle():
    overrides = parse_overrides(["--export.cascades=null", "--export.bundles.bilstm-engine=null"])
    assert "bilstm-engine" not in load_recipe(ROOT / "recipes" / "smoke.yaml", overrides).export.bundles


def test_an_override_of_null_for_a_bundle_the_recipe_lacks_is_refused_naming_it():
    with pytest.raises(
        RecipeError, match=r"override --export\.bundles\.nope=null drops nothing: export\.bundles has no"
    ):
        load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides(["--export.bundles.nope=null"]))


def test_an_override_of_null_for_a_setting_beside_sections_sets_it(tmp_path):
    path = write(tmp_path, MINIMAL + "loadtest: {soak: {slo: {p99_ms: 50}}}\n")
    overrides = parse_overrides(["--loadtest.soak.max_rss_growth_mb_per_10k=null"])
    assert load_recipe(path, overrides).loadtest.soak.max_rss_growth_mb_per_10k is None


def test_an_override_of_null_for_the_pair_column_marks_it_given(tmp_path):
    overrides = parse_overrides(["--data.text_pair_column=null"])
    assert "text_pair_column" in load_recipe(write(tmp_path, MINIMAL), overrides).data.model_fields_set


def test_the_pair_column_unset_is_not_marked_given(tmp_path):
    assert "text_pair_column" not in load_recipe(write(tmp_path, MINIMAL)).data.model_fields_set


def test_the_pair_column_set_to_null_leaves_the_hash_of_a_recipe_without_it(tmp_path):
    overrides = parse_overrides(["--data.text_pair_column=null"])
    assert load_recipe(write(tmp_path, MINIMAL), overrides).hash == load_recipe(write(tmp_path, MINIMAL)).hash


@pytest.mark.parametrize("fused", [True, False])
def test_fused_on_a_bundle_of_a_student_no_fusion_takes_is_refused_naming_it(fused):
    with pytest.raises(RecipeError, match=r"export\.bundles\.bilstm-int8\.fused would not apply: .* a bilstm student"):
        load_recipe(SMOKE, {"export.bundles.bilstm-int8.fused": fused})


def test_int8_ops_naming_an_operator_twice_is_refused():
    with pytest.raises(RecipeError, match=r"int8_ops names \['Gather'\] more than once"):
        load_recipe(SMOKE, {"export.bundles.bilstm-int8.int8_ops": ["Gather", "Gather"]})


def test_empty_int8_ops_are_refused_as_every_type(tmp_path):
    with pytest.raises(RecipeError, match=r"int8_ops is empty, which ONNX Runtime reads as every type it quantizes"):
        load_recipe(SMOKE, {"export.bundles.bilstm-int8.int8_ops": []})


def base_with_an_unknown_key(tmp_path) -> Path:
    """A recipe extending one whose finetune section holds a misspelt key (`optm`)."""
    write(tmp_path, MINIMAL + "finetune: {optm: {lr: 1.0e-4}}\n", "base.yaml")
    return write(tmp_path, "extends: base.yaml\nfinetune: {pooling: mean}\n", "child.yaml")


def test_an_unknown_key_a_base_wrote_is_named_with_the_base(tmp_path):
    with pytest.raises(RecipeError, match=r"finetune\.optm: unknown key: .*\(finetune\.optm comes from \S+base\.yaml"):
        load_recipe(base_with_an_unknown_key(tmp_path))


def test_an_unknown_key_an_override_wrote_into_a_bases_section_is_not_named_with_the_base(tmp_path):
    with pytest.raises(RecipeError) as refused:
        load_recipe(base_with_an_unknown_key(tmp_path), parse_overrides(["--finetune.optm.momentum=0.9"]))
    assert "comes from" not in str(refused.value)


def test_an_override_without_its_dashes_and_value_is_refused():
    with pytest.raises(RecipeError, match=r"^override 'finetune\.optim\.lr' must look like --section\.key=value"):
        parse_overrides(["finetune.optim.lr"])


@pytest.mark.parametrize("arg", ["--a.x=[1,2", "--a.x=@a", "--data.text_column=*t"])
def test_an_override_that_is_not_yaml_is_refused_naming_it(arg):
    key = arg[2:].partition("=")[0]
    with pytest.raises(RecipeError, match=rf"^override --{re.escape(key)}: .* is not a YAML value"):
        parse_overrides([arg])


def test_an_override_given_twice_is_refused_naming_both():
    message = r"^override --finetune\.optim\.lr is given twice \(--finetune\.optim\.lr=1 and --finetune\.optim\.lr=2\)"
    with pytest.raises(RecipeError, match=message):
        parse_overrides(["--finetune.optim.lr=1", "--finetune.optim.lr=2"])


@pytest.mark.parametrize(
    "args",
    [
        ["--finetune.optim.lr=2", "--finetune.optim={epochs: 5}"],
        ["--finetune.optim={epochs: 5}", "--finetune.optim.lr=2"],
    ],
)
def test_an_override_inside_a_section_another_gives_whole_is_refused_naming_both(args):
    message = rf"^overrides {re.escape(args[0])} and {re.escape(args[1])} both set finetune\.optim\.lr"
    with pytest.raises(RecipeError, match=message):
        parse_overrides(args)


def test_overrides_of_keys_that_share_a_prefix_are_taken():
    assert parse_overrides(["--finetune.optim.lr=1", "--finetune.optim.lr_x=2"]) == {
        "finetune.optim.lr": 1,
        "finetune.optim.lr_x": 2,
    }


def test_a_mapping_the_shell_split_at_a_space_is_to_be_quoted_whole():
    with pytest.raises(RecipeError, match=r"quote the whole argument: '--finetune\.optim=\{lr: 1e-4\}'$"):
        parse_overrides(["--finetune.optim={lr:", "1e-4}"])


def test_a_list_that_is_not_yaml_is_not_to_be_quoted_as_text():
    with pytest.raises(
        RecipeError, match=r"quote the whole argument for the shell where it holds spaces: '--a\.x=\[\.\.\.\]'$"
    ):
        parse_overrides(["--a.x=[1,2"])


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_override_is_refused_not_read_as_null(value):
    """`--model.init=$CKPT` with CKPT unset would build the teacher from scratch; a null is written `null`."""
    with pytest.raises(RecipeError, match=r"^override --model\.init=.* is empty \(an unset shell variable\?\): .*null"):
        parse_overrides([f"--model.init={value}"])


def test_a_variable_unquoted_inside_a_list_override_is_to_be_quoted_for_yaml_not_for_the_shell():
    with pytest.raises(
        RecipeError,
        match=r"""quote a value that holds \$\{NAME\}.*: '--a\.x=\["\$\{EDGEDISTILL_DATA_DIR\}/file\.txt"\]'$""",
    ):
        parse_overrides(["--a.x=[${EDGEDISTILL_DATA_DIR}/u.txt]"])


def test_a_command_given_an_override_that_is_not_yaml_exits_with_status_2(capsys):
    assert cli.main(["report", str(ROOT / "recipes" / "smoke.yaml"), "--a.x=[1,2"]) == 2


def test_a_recipe_that_is_not_utf8_is_refused_naming_it(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes(MINIMAL.encode() + "# caf\xe9\n".encode("latin-1"))
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(path))}: not UTF-8 text"):
        load_recipe(path)


def test_a_base_recipe_that_is_not_utf8_is_refused_naming_the_base(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_bytes(MINIMAL.encode() + "# caf\xe9\n".encode("latin-1"))
    with pytest.raises(RecipeError, match=rf"^{re.escape(str(base))}: not UTF-8 text"):
        load_recipe(write(tmp_path, "extends: base.yaml\n"))


def test_an_override_yaml_reads_as_octal_is_refused_naming_the_number_it_would_be():
    with pytest.raises(
        RecipeError, match=r"^override --finetune\.optim\.seed: YAML 1\.1 reads 010 as an octal number, 8"
    ):
        parse_overrides(["--finetune.optim.seed=010"])


def test_an_override_yaml_reads_as_base_60_is_refused():
    with pytest.raises(RecipeError, match=r"^override --a\.x: YAML 1\.1 reads 1:30 as a base-60 number, 90"):
        parse_overrides(["--a.x=1:30"])


def test_an_override_of_a_plain_zero_is_the_number():
    assert parse_overrides(["--finetune.optim.seed=0"]) == {"finetune.optim.seed": 0}


@pytest.mark.parametrize("value", ["yes", "true"])
def test_a_boolean_for_a_whole_number_is_refused(tmp_path, value):
    with pytest.raises(RecipeError, match=r"finetune\.optim\.batch_size: a boolean where a number goes"):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides([f"--finetune.optim.batch_size={value}"]))


def test_a_boolean_for_a_real_number_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"finetune\.optim\.lr: a boolean where a number goes"):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {lr: on}}\n"))


def test_a_boolean_in_a_list_of_numbers_is_refused():
    overrides = parse_overrides(["--bench.models.batch_sizes=[1, true]"])
    with pytest.raises(RecipeError, match=r"bench\.models\.batch_sizes: a boolean where a number goes"):
        load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


@pytest.mark.parametrize("value", [".inf", ".nan"])
def test_a_number_that_is_not_finite_is_refused(tmp_path, value):
    with pytest.raises(RecipeError, match=r"finetune\.optim\.epochs: Input should be a finite number"):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides([f"--finetune.optim.epochs={value}"]))


def test_extends_merges_sections(tmp_path):
    write(tmp_path, MINIMAL + "finetune: {optim: {lr: 0.1, epochs: 3}}\n", "base.yaml")
    recipe = load_recipe(write(tmp_path, "extends: base.yaml\nfinetune: {optim: {lr: 0.2}}\n"))
    assert recipe.name == "exp"
    assert recipe.finetune.optim.lr == 0.2
    assert recipe.finetune.optim.epochs == 3


def test_extends_of_a_missing_file_is_refused_naming_it(tmp_path):
    with pytest.raises(RecipeError, match=r"bad\.yaml: extends nope\.yaml, which does not exist"):
        load_recipe(write(tmp_path, "extends: nope.yaml\n", "bad.yaml"))


def test_a_missing_recipe_file_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "missing.yaml")


def test_a_folder_given_as_the_recipe_lists_its_recipe_files(tmp_path):
    write(tmp_path, MINIMAL, "trec.yaml")
    with pytest.raises(
        RecipeError, match=rf"^recipe {tmp_path} is a folder: give one of its recipe files \({tmp_path}/trec\.yaml\)$"
    ):
        load_recipe(tmp_path)


def test_a_folder_without_recipe_files_given_as_the_recipe_says_it_is_a_folder(tmp_path):
    with pytest.raises(RecipeError, match=rf"^recipe {tmp_path} is a folder, with no recipe \(\*\.yaml\) in it: "):
        load_recipe(tmp_path)


def test_a_misspelt_option_is_not_called_a_malformed_override():
    with pytest.raises(RecipeError, match=r"^--froce: no such option, nor a recipe section: "):
        parse_overrides(["--froce"])


def test_a_misspelt_option_given_its_value_after_an_equals_sign_is_refused_as_no_option():
    with pytest.raises(RecipeError, match=r"^--job: no such option, nor a recipe section: "):
        parse_overrides(["--job=2"])


def test_a_misspelt_short_option_is_refused_as_no_option():
    with pytest.raises(RecipeError, match=r"^-j: no such option, nor a recipe section: "):
        parse_overrides(["-j", "2"])


def test_a_misspelt_option_is_answered_with_the_nearest_of_the_commands_options():
    assert "did you mean --jobs? " in not_an_override(["--job=2"], 0, ["-h", "--help", "--jobs", "--force"])


def test_a_misspelt_section_is_answered_with_the_nearest_section_as_an_override():
    with pytest.raises(RecipeError, match=r"^--finetun: .*did you mean --finetune\.key=VALUE\? "):
        parse_overrides(["--finetun={optim: {lr: 0.1}}"])


def test_a_misspelt_option_near_no_option_is_not_answered_with_a_section_as_an_option():
    assert "did you mean --model? " not in not_an_override(["--bundel", "x"], 0, ["--only", "--force"])


def test_a_misspelt_recipe_value_is_answered_with_its_key():
    assert "did you mean --name=VALUE? " in not_an_override(["--nme=x"], 0, ["--jobs"])


def test_a_top_level_setting_given_after_an_equals_sign_is_an_override():
    assert parse_overrides(["--tracking=mlflow"]) == {"tracking": "mlflow"}


def test_a_recipe_key_given_its_value_after_a_space_is_refused_saying_to_write_it_after_an_equals_sign():
    with pytest.raises(RecipeError, match=r"^--name: an override gives its value after =, not a space: --name=VALUE$"):
        parse_overrides(["--name", "x"])


def test_a_dotted_key_given_its_value_after_a_space_is_refused_saying_to_write_it_after_an_equals_sign():
    message = r"^--finetune\.optim\.lr: an override gives its value after =, not a space: --finetune\.optim\.lr=VALUE$"
    with pytest.raises(RecipeError, match=message):
        parse_overrides(["--finetune.optim.lr", "5e-5"])


def test_a_dotted_key_with_no_value_after_it_is_called_a_malformed_override():
    with pytest.raises(RecipeError, match=r"^override '--finetune\.optim\.lr' must look like --section\.key=value"):
        parse_overrides(["--finetune.optim.lr", "--force"])


def test_a_misspelt_recipe_file_is_answered_with_the_file_beside_it(tmp_path):
    write(tmp_path, MINIMAL, "smoke.yaml")
    with pytest.raises(RecipeError, match=f"did you mean {re.escape(str(tmp_path / 'smoke.yaml'))}\\? give a recipe"):
        load_recipe(tmp_path / "smok.yaml")


def test_a_misspelt_recipe_file_without_a_folder_is_answered_with_the_file_in_the_working_directory(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, MINIMAL, "mytrec.yaml")
    with pytest.raises(RecipeError, match=r"recipe mytrek.yaml does not exist: did you mean mytrec.yaml\? "):
        load_recipe("mytrek.yaml")


def test_the_recipe_folders_listed_for_a_missing_recipe_are_those_that_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError) as caught:
        load_recipe("nosuch")
    assert str(tmp_path / "recipes") not in str(caught.value)


def test_a_misspelt_recipe_name_is_answered_with_the_nearest_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError, match=r"recipe smokee does not exist: did you mean smoke\? "):
        load_recipe("smokee")


def test_a_recipe_named_without_a_folder_is_read_from_the_installed_recipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_recipe("smoke").model_dump() == load_recipe(ROOT / "recipes" / "smoke.yaml").model_dump()


def test_a_recipe_named_without_a_folder_takes_the_working_directorys_recipes_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    write(tmp_path / "recipes", "extends: ../base.yaml\n", "smoke.yaml")
    write(tmp_path, MINIMAL, "base.yaml")
    assert load_recipe("smoke").model.init == "some/model"


def test_extends_a_name_finds_an_installed_recipe_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(write(tmp_path, "extends: sst2\nfinetune: {optim: {lr: 0.2}}\n"))
    assert recipe.distill.deploy == load_recipe(ROOT / "recipes" / "sst2.yaml").distill.deploy


def test_an_unknown_recipe_name_lists_the_recipes_there_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError, match=r"one of mrpc, rte, smoke, sst2, "):
        load_recipe("nosuch")


def test_section_hash_tracks_only_its_sections(tmp_path):
    a = load_recipe(write(tmp_path, MINIMAL))
    b = load_recipe(write(tmp_path, MINIMAL), {"finetune.optim.lr": 1e-3})
    assert a.section_hash("data", "model") == b.section_hash("data", "model")
    assert a.section_hash("finetune") != b.section_hash("finetune")


def test_how_a_batch_is_split_leaves_the_hash_unchanged(tmp_path):
    plain = load_recipe(write(tmp_path, MINIMAL))
    changed = load_recipe(write(tmp_path, MINIMAL), {"finetune.optim.grad_accum": 5})
    assert plain.section_hash("finetune") == changed.section_hash("finetune")


def test_epochs_leave_the_hash_unchanged_where_max_steps_is_the_step_budget(tmp_path):
    path = write(tmp_path, MINIMAL + "finetune: {optim: {max_steps: 50}}\n")
    assert load_recipe(path).section_hash("finetune") == load_recipe(path, {"finetune.optim.epochs": 3}).section_hash(
        "finetune"
    )


def test_epochs_change_the_hash_where_no_max_steps_is_set(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert load_recipe(path).section_hash("finetune") != load_recipe(path, {"finetune.optim.epochs": 3}).section_hash(
        "finetune"
    )


def test_the_collectives_timeout_leaves_the_hash_unchanged(tmp_path):
    plain = load_recipe(write(tmp_path, MINIMAL))
    longer = load_recipe(write(tmp_path, MINIMAL), {"runtime.collective_timeout_s": 7200})
    assert plain.hash == longer.hash


def test_the_collectives_timeout_is_30_minutes_by_default(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL)).runtime.collective_timeout_s == 1800


STUDENT = MINIMAL + (
    "transfer: {unlabelled_files: [u.txt]}\n"
    "distill: {deploy: cnn, students: {cnn: {model: {arch: cnn}, optim: {epochs: 3}}}}\n"
)


def test_a_students_optim_that_sets_some_keys_keeps_the_students_preset_for_the_others(tmp_path):
    optim = load_recipe(write(tmp_path, STUDENT)).distill.students["cnn"].optim
    assert optim == OptimConfig(lr=1e-3, batch_size=64, epochs=3)


def test_a_dotted_override_of_a_students_optim_keeps_the_students_preset_for_the_others(tmp_path):
    overrides = parse_overrides(["--distill.students.extra.model.arch=cnn", "--distill.students.extra.optim.epochs=3"])
    optim = load_recipe(write(tmp_path, STUDENT), overrides).distill.students["extra"].optim
    assert optim == OptimConfig(lr=1e-3, batch_size=64, epochs=3)


def test_a_pretrain_optim_that_sets_some_keys_keeps_the_pretrain_preset_for_the_others(tmp_path):
    text = MINIMAL + "pretrain: {train_files: [a.txt], optim: {max_steps: 400}}\n"
    assert load_recipe(write(tmp_path, text)).pretrain.optim == OptimConfig(lr=1e-4, max_steps=400)


def test_a_key_a_students_optim_sets_wins_over_the_preset(tmp_path):
    optim = load_recipe(write(tmp_path, STUDENT.replace("epochs: 3", "lr: 0.01"))).distill.students["cnn"].optim
    assert optim == OptimConfig(lr=0.01, batch_size=64)


def test_eval_max_lines_leaves_the_pretrain_hash_unchanged_where_train_lines_are_held_out(tmp_path):
    path = write(tmp_path, MINIMAL + "pretrain: {train_files: [p.txt]}\n")
    changed = load_recipe(path, {"pretrain.eval_max_lines": 50})
    assert load_recipe(path).section_hash("pretrain") == changed.section_hash("pretrain")


def test_eval_max_lines_changes_the_pretrain_hash_where_eval_files_are_read(tmp_path):
    path = write(tmp_path, MINIMAL + "pretrain: {train_files: [p.txt], eval_files: [e.txt]}\n")
    changed = load_recipe(path, {"pretrain.eval_max_lines": 50})
    assert load_recipe(path).section_hash("pretrain") != changed.section_hash("pretrain")


AUGMENTATION = {"max_augmented": 10, "p_mask": 0.3, "p_replace": 0.3, "p_ngram": 0.5}


@pytest.mark.parametrize("key", AUGMENTATION)
def test_an_augmentation_setting_leaves_the_transfer_hash_unchanged_where_nothing_is_augmented(tmp_path, key):
    path = write(tmp_path, MINIMAL + "transfer: {unlabelled_files: [u.txt], n_iter: 0}\n")
    changed = load_recipe(path, {f"transfer.{key}": AUGMENTATION[key]})
    assert load_recipe(path).section_hash("transfer") == changed.section_hash("transfer")


@pytest.mark.parametrize("key", AUGMENTATION)
def test_an_augmentation_setting_changes_the_transfer_hash_where_texts_are_augmented(tmp_path, key):
    path = write(tmp_path, MINIMAL + "transfer: {unlabelled_files: [u.txt]}\n")
    changed = load_recipe(path, {f"transfer.{key}": AUGMENTATION[key]})
    assert load_recipe(path).section_hash("transfer") != changed.section_hash("transfer")


def test_the_finetune_hash_of_default_settings_is_the_one_runs_were_built_with(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL)).section_hash("finetune") == "89909594ecbea52f"


PAIRS = MINIMAL.replace("label_names", "text_pair_column: b, label_names")


def test_a_later_setting_at_its_default_leaves_the_hash_unchanged(tmp_path):
    plain = load_recipe(write(tmp_path, PAIRS))
    explicit = load_recipe(write(tmp_path, PAIRS), {"data.symmetric_pairs": False})
    assert plain.section_hash("data") == explicit.section_hash("data")


def test_a_later_setting_set_changes_the_hash(tmp_path):
    plain = load_recipe(write(tmp_path, PAIRS))
    symmetric = load_recipe(write(tmp_path, PAIRS), {"data.symmetric_pairs": True})
    assert plain.section_hash("data") != symmetric.section_hash("data")


def test_symmetric_pairs_without_pairs_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="symmetric_pairs needs data.text_pair_column"):
        load_recipe(write(tmp_path, MINIMAL), {"data.symmetric_pairs": True})


def test_a_section_rule_names_its_keys_after_the_file_alone(tmp_path):
    with pytest.raises(RecipeError, match=r"exp\.yaml: data\.symmetric_pairs needs"):
        load_recipe(write(tmp_path, MINIMAL), {"data.symmetric_pairs": True})


def test_a_recipe_wide_rule_names_its_keys_after_the_file_alone(tmp_path):
    with pytest.raises(RecipeError, match=r"exp\.yaml: model\.init is null"):
        load_recipe(write(tmp_path, MINIMAL.replace("init: some/model", "init: null")))


def test_a_field_rule_keeps_the_key_it_checks(tmp_path):
    student = "distill: {deploy: t, students: {t: {model: {arch: transformer, hidden_size: 10, num_heads: 3}}}}\n"
    with pytest.raises(RecipeError, match=r"exp\.yaml: distill\.students\.t\.model: hidden_size=10 is not divisible"):
        load_recipe(write(tmp_path, MINIMAL + student))


def test_a_file_name_that_is_no_run_name_says_the_name_comes_from_it(tmp_path):
    with pytest.raises(RecipeError, match=r"from the file name 'my exp': rename the file, or set name:"):
        load_recipe(write(tmp_path, MINIMAL, name="my exp.yaml"))


def test_a_run_name_given_on_the_command_line_is_not_blamed_on_the_file(tmp_path):
    with pytest.raises(RecipeError, match=r"exp\.yaml: name: 'my exp' is not valid: give the run folder's") as refused:
        load_recipe(write(tmp_path, MINIMAL), {"name": "my exp"})
    assert "file name" not in str(refused.value)


def test_a_run_name_that_leaves_the_runs_folder_is_refused(tmp_path):
    with pytest.raises(
        RecipeError, match=r"name: '\.\.' is not valid: give .*letters, digits, `\.`, `_` and `-`, start"
    ):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides(["--name=.."]))


def test_a_recipe_file_named_with_a_dot_names_its_run_so(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL, name="sst2.v2.yaml")).name == "sst2.v2"


def test_a_bundle_name_with_a_dot_is_refused_naming_the_rule(tmp_path):
    bundles = "export: {deploy: cnn.int8, bundles: {cnn.int8: {source: teacher, precision: int8}}}\n"
    rule = r"export\.bundles\.cnn\.int8: 'cnn\.int8' is not a valid name: give letters, digits, `_` and `-`"
    with pytest.raises(RecipeError, match=rule):
        load_recipe(write(tmp_path, MINIMAL + bundles))


@pytest.mark.parametrize(
    ("arch", "setting"),
    [("cnn", "pooling=mean"), ("cnn", "hidden_size=64"), ("cnn", "num_layers=2"), ("transformer", "embed_dim=64"),
     ("bilstm", "num_filters=8"), ("bilstm", "kernel_sizes=[2]")],
)  # fmt: skip
def test_a_student_setting_its_arch_does_not_read_is_refused_naming_the_key(arch, setting):
    overrides = parse_overrides([f"--distill.students.{arch}.model.{setting}"])
    key = re.escape(f"distill.students.{arch}.model.{setting.partition('=')[0]}")
    with pytest.raises(RecipeError, match=rf"smoke\.yaml: {key} would change nothing: a {arch} student reads "):
        load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


def test_a_student_setting_its_arch_reads_is_taken():
    overrides = parse_overrides(["--distill.students.bilstm.model.pooling=mean"])
    assert load_recipe(ROOT / "recipes" / "smoke.yaml", overrides).distill.students["bilstm"].model.pooling == "mean"


def test_a_student_named_teacher_is_refused():
    overrides = parse_overrides(["--distill.students.teacher.model.arch=cnn"])
    with pytest.raises(RecipeError, match=r"smoke\.yaml: distill\.students\.teacher: the name is the teacher's"):
        load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


def test_a_student_name_with_a_slash_is_refused(tmp_path):
    student = "distill: {deploy: a/b, students: {a/b: {model: {arch: cnn}}}}\n"
    with pytest.raises(RecipeError, match=r"distill\.students\.a/b: 'a/b' is not a valid name"):
        load_recipe(write(tmp_path, MINIMAL + student))


def test_settings_refuses_a_key_the_recipe_has_not():
    with pytest.raises(KeyError, match="export.bundles.cnn.int8: the recipe has no such setting"):
        load_recipe(ROOT / "recipes" / "smoke.yaml").settings("export.bundles.cnn.int8")


def test_settings_of_a_setting_left_at_its_default_and_out_of_the_dump_is_none():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    assert recipe.settings("export.min_int8_agreement") == {"export.min_int8_agreement": None}


def test_mean_pooling_on_a_gpt_teacher_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="finetune.pooling=mean needs a bert teacher"):
        load_recipe(write(tmp_path, MINIMAL), {"model.family": "gpt", "finetune.pooling": "mean"})


def test_classifier_dropout_on_a_gpt_teacher_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="finetune.classifier_dropout needs a bert teacher"):
        load_recipe(write(tmp_path, MINIMAL), {"model.family": "gpt", "finetune.classifier_dropout": 0.2})


def test_whole_word_masking_for_a_gpt_teacher_is_refused(tmp_path):
    pretrain = "pretrain: {train_files: [corpus.txt], whole_word_mask: true}\n"
    with pytest.raises(RecipeError, match="pretrain.whole_word_mask needs a bert teacher"):
        load_recipe(write(tmp_path, MINIMAL + pretrain), {"model.family": "gpt"})


def test_a_masking_probability_for_a_gpt_teacher_is_refused(tmp_path):
    pretrain = "pretrain: {train_files: [corpus.txt], mlm_probability: 0.2}\n"
    with pytest.raises(RecipeError, match="pretrain.mlm_probability needs a bert teacher"):
        load_recipe(write(tmp_path, MINIMAL + pretrain), {"model.family": "gpt"})


def test_lines_held_out_beside_evaluation_files_are_refused(tmp_path):
    pretrain = "pretrain: {train_files: [corpus.txt], eval_files: [held.txt], eval_holdout_lines: 300}\n"
    with pytest.raises(RecipeError, match="eval_holdout_lines holds out the last train lines only where eval_files"):
        load_recipe(write(tmp_path, MINIMAL + pretrain))


def test_default_pooling_leaves_the_finetune_hash_unchanged(tmp_path):
    plain = load_recipe(write(tmp_path, MINIMAL))
    explicit = load_recipe(write(tmp_path, MINIMAL), {"finetune.pooling": "cls"})
    assert plain.section_hash("finetune") == explicit.section_hash("finetune")


def test_section_hash_follows_the_data_contents_not_their_paths(tmp_path):
    for place in ("here", "there"):
        (tmp_path / place / "model").mkdir(parents=True)
        (tmp_path / place / "train.tsv").write_text("sentence\tlabel\ngood\t1\n")
        (tmp_path / place / "model" / "config.json").write_text("{}")

    def data_hash(place: str) -> str:
        folder = tmp_path / place
        text = (
            f"data: {{train: {folder}/train.tsv, dev: {folder}/train.tsv, label_names: [bad, good]}}\n"
            f"model: {{init: {folder}/model}}\n"
        )
        return load_recipe(write(tmp_path, text)).section_hash("data", "model")

    assert data_hash("here") == data_hash("there"), "moved data must keep artifacts current"
    before = data_hash("there")
    (tmp_path / "there" / "train.tsv").write_text("sentence\tlabel\nbad\t0\n")
    assert data_hash("there") != before, "edited data must make artifacts stale"
    (tmp_path / "there" / "model" / "config.json").write_text('{"hidden_size": 8}')
    assert data_hash("here") != data_hash("there"), "an edited model folder must make artifacts stale"


# --- labels and the selection metric ---------------------------------------------------------------------------

TREC_DATA = "data: {train: a.tsv, dev: b.tsv, label_names: [ABBR, DESC, ENTY, HUM, LOC, NUM]%s}\nmodel: {init: m/x}\n"


def test_label_names_are_required_and_the_error_says_to_list_them(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.label_names is missing: list the task's label names in the recipe"):
        load_recipe(write(tmp_path, "data: {train: a.tsv, dev: b.tsv}\nmodel: {init: some/model}\n"))


def test_label_names_must_differ(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.label_names lists \['good'\] more than once"):
        load_recipe(write(tmp_path, MINIMAL.replace("[negative, positive]", "[good, bad, good]")))


def test_label_names_equal_but_for_how_an_accent_is_typed_are_one_name_listed_twice():
    with pytest.raises(ValueError, match=r"data\.label_names lists \['caf\u00e9'\] more than once"):
        DataConfig(train="unused", dev="unused", label_names=["caf\u00e9", "cafe\u0301", "other"])


def test_label_names_apart_only_by_a_zero_width_character_are_one_name_listed_twice():
    with pytest.raises(ValueError, match=r"data\.label_names lists \['pos'\] more than once"):
        DataConfig(train="unused", dev="unused", label_names=["pos", "pos\u200b"])


def test_a_positive_label_typed_with_a_combining_accent_names_the_composed_label():
    names = ["neg", "caf\u00e9"]
    assert DataConfig(train="unused", dev="unused", label_names=names, positive_label="cafe\u0301").positive_index == 1


def test_empty_label_name_is_refused_as_the_server_would_answer_with_it(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.label_names: '' is no name"):
        load_recipe(write(tmp_path, MINIMAL.replace("[negative, positive]", '[negative, "", positive]')))


def test_label_name_with_spaces_around_it_is_refused_naming_the_name_to_write(tmp_path):
    with pytest.raises(RecipeError, match=r"'neutral ' has spaces around it, .* write 'neutral'"):
        load_recipe(write(tmp_path, MINIMAL.replace("[negative, positive]", '[negative, "neutral ", positive]')))


def test_label_name_with_a_line_break_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"'neu\\ntral' holds a line break"):
        load_recipe(write(tmp_path, MINIMAL.replace("[negative, positive]", '[negative, "neu\\ntral", positive]')))


def test_label_name_with_inner_spaces_and_punctuation_is_a_name(tmp_path):
    names = '["not entailment", "contra:diction"]'
    recipe = load_recipe(write(tmp_path, MINIMAL.replace("[negative, positive]", names)))
    assert recipe.data.label_names == ["not entailment", "contra:diction"]


def test_label_names_yaml_reads_as_booleans_get_a_quoting_hint(tmp_path):
    with pytest.raises(RecipeError, match=r"\[False, True\] are not names: .* quote them"):
        load_recipe(write(tmp_path, MINIMAL.replace("[negative, positive]", "[no, yes]")))


def test_quoted_label_names_are_names(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL.replace("[negative, positive]", '["no", "yes"]'))).data.label_names == [
        "no",
        "yes",
    ]


@pytest.mark.parametrize("value", ["2", "yes"])
def test_label_names_that_are_no_list_are_refused_naming_the_key(tmp_path, value):
    with pytest.raises(RecipeError, match=r"data\.label_names: Input should be a valid list"):
        load_recipe(write(tmp_path, MINIMAL.replace("[negative, positive]", value)))


def test_label_names_overridden_by_a_number_are_refused_naming_the_key():
    with pytest.raises(RecipeError, match=r"data\.label_names: Input should be a valid list"):
        load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides(["--data.label_names=3"]))


@pytest.mark.parametrize("arg", ["--loadtest.steady=[1]", "--loadtest.steady=5", "--loadtest.soak=3"])
def test_a_load_profile_that_is_no_mapping_is_refused_naming_it(arg):
    profile = arg.split("=")[0].removeprefix("--")
    with pytest.raises(RecipeError, match=rf"{re.escape(profile)}: Input should be a valid dictionary"):
        load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides([arg]))


@pytest.mark.parametrize("value", ["off", "false", "0", "''"])
def test_a_load_profile_written_as_a_false_value_is_refused_not_read_as_its_preset(tmp_path, value):
    with pytest.raises(RecipeError, match=r"loadtest\.soak: Input should be a valid dictionary"):
        load_recipe(write(tmp_path, MINIMAL + f"loadtest: {{soak: {value}}}\n"))


def test_metric_defaults_to_accuracy(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL)).data.metric == "accuracy"


def test_binary_positive_class_defaults_to_the_second_label(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL)).data.positive_index == 1


def test_positive_label_names_the_positive_class(tmp_path):
    assert load_recipe(write(tmp_path, TREC_DATA % ", positive_label: HUM")).data.positive_index == 3


def test_multiclass_has_no_default_positive_class(tmp_path):
    assert load_recipe(write(tmp_path, TREC_DATA % "")).data.positive_index is None


def binary(**fields) -> DataConfig:
    return DataConfig(train="unused", dev="unused", label_names=["no", "yes"], **fields)


@pytest.mark.parametrize(
    "metric, key", [("accuracy", "dev_accuracy"), ("macro_f1", "dev_macro_f1"), ("f1", "dev_f1")], ids=str
)
def test_selection_key_follows_the_recipes_metric(metric, key):
    assert binary(metric=metric).selection_key == key


def test_selection_key_defaults_to_accuracy():
    assert binary().selection_key == "dev_accuracy"


@pytest.mark.parametrize(
    "metric, keys",
    [("accuracy", ["dev_accuracy", "dev_f1"]), ("macro_f1", ["dev_accuracy", "dev_macro_f1", "dev_f1"])],
    ids=str,
)
def test_dev_keys_are_accuracy_the_selection_metric_then_the_binary_tasks_f1(metric, keys):
    assert binary(metric=metric).dev_keys == keys


def test_dev_keys_of_many_labels_give_macro_f1_whatever_the_selection_metric():
    data = DataConfig(train="unused", dev="unused", label_names=["a", "b", "c"])
    assert data.dev_keys == ["dev_accuracy", "dev_macro_f1"]


def test_dev_keys_of_many_labels_with_a_positive_class_give_its_f1():
    data = DataConfig(train="unused", dev="unused", label_names=["a", "b", "c"], positive_label="c", metric="f1")
    assert data.dev_keys == ["dev_accuracy", "dev_f1", "dev_macro_f1"]


def test_the_shipped_trec_recipe_shows_dev_macro_f1(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "data")
    assert "dev_macro_f1" in load_recipe(ROOT / "recipes" / "trec.yaml").data.figure_keys(test=False)


def test_the_shipped_mrpc_recipe_shows_dev_f1(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "data")
    assert "dev_f1" in load_recipe(ROOT / "recipes" / "mrpc.yaml").data.figure_keys(test=False)


def test_the_shipped_trec_recipe_shows_test_macro_f1_beside_the_test_split(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "data")
    assert "test_macro_f1" in load_recipe(ROOT / "recipes" / "trec.yaml").data.figure_keys(test=True)


def test_macro_f1_is_a_metric_for_multiclass(tmp_path):
    assert load_recipe(write(tmp_path, TREC_DATA % ", metric: macro_f1")).data.metric == "macro_f1"


def test_f1_on_multiclass_needs_a_positive_label(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.metric=f1 needs data\.positive_label"):
        load_recipe(write(tmp_path, TREC_DATA % ", metric: f1"))


def test_positive_label_must_be_a_label_name(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.positive_label='hum' is not one of data\.label_names"):
        load_recipe(write(tmp_path, TREC_DATA % ", positive_label: hum"))


def test_a_positive_label_of_a_multiclass_task_that_is_no_label_name_is_not_offered_a_default(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, TREC_DATA % ", positive_label: hum"))
    assert "or to null" not in str(err.value)


@pytest.mark.parametrize("field", ["text_column", "label_column"])
def test_a_column_given_as_null_is_refused_asking_for_its_name(tmp_path, field):
    text = MINIMAL.replace("label_names: [negative, positive]}", f"label_names: [negative, positive], {field}: null}}")
    with pytest.raises(RecipeError, match=rf"data\.{field} is empty: name the \w+ column"):
        load_recipe(write(tmp_path, text))


@pytest.mark.parametrize("field", ["text_column", "text_pair_column", "label_column", "positive_label"])
def test_a_name_written_after_an_unquoted_hash_is_refused_at_its_line_asking_to_quote_it(tmp_path, field):
    text = f"data:\n  train: a.tsv\n  dev: b.tsv\n  {field}: #2 String\n  label_names: [negative, positive]\n"
    with pytest.raises(RecipeError, match=rf'exp\.yaml:4: data\.{field}: .* quote the value \({field}: "#2 String"\)'):
        load_recipe(write(tmp_path, text + "model: {init: some/model}\n"))


def test_a_comment_after_an_empty_pair_column_reads_as_null(tmp_path):
    text = "data:\n  train: a.tsv\n  dev: b.tsv\n  text_pair_column:   # single texts, on purpose\n"
    text += "  label_names: [negative, positive]\nmodel: {init: some/model}\n"
    assert load_recipe(write(tmp_path, text)).data.text_pair_column is None


def test_an_unknown_metric_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.metric: Input should be 'accuracy', 'macro_f1' or 'f1'"):
        load_recipe(write(tmp_path, TREC_DATA % ", metric: auc"))


# --- ${NAME} and paths relative to the recipe --------------------------------------------------------------------


def test_any_environment_variable_expands(tmp_path, monkeypatch):
    monkeypatch.setenv("TASK_DIR", "/tasks/trec")
    assert load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", '"${TASK_DIR}/train.tsv"'))).data.train == (
        "/tasks/trec/train.tsv"
    )


@pytest.mark.parametrize(
    ("variable", "value"), [(settings.PROGRESS_VAR, "bogus"), (settings.PROGRESS_INTERVAL_VAR, "-1")]
)
def test_a_bad_progress_setting_is_refused_as_the_recipe_is_read(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingError, match=f"^{variable}="):
        load_recipe("recipes/smoke.yaml")


def test_settings_keep_their_defaults_when_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEDISTILL_DATA_DIR", raising=False)
    recipe = load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", '"${DATA_DIR}/a.tsv"')))
    assert recipe.data.train == settings.defaults()["EDGEDISTILL_DATA_DIR"] + "/a.tsv"


def test_an_unset_variable_names_the_file_and_key(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE", raising=False)
    with pytest.raises(
        RecipeError, match=r"exp\.yaml: data\.train: unknown setting \$\{NOPE\}: no environment variable"
    ):
        load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", '"${NOPE}/a.tsv"')))


def test_an_empty_variable_is_refused_naming_the_key_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MYDATA", "")
    with pytest.raises(RecipeError, match=r"exp\.yaml: data\.train: \$\{MYDATA\} is set but empty"):
        load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", '"${MYDATA}/sst2/train.tsv"')))


def test_an_empty_teacher_variable_is_refused_not_read_as_from_scratch(tmp_path, monkeypatch):
    monkeypatch.setenv("MYTEACHER", "")
    with pytest.raises(RecipeError, match=r"model\.init: \$\{MYTEACHER\} is set but empty"):
        load_recipe(write(tmp_path, MINIMAL.replace("some/model", '"${MYTEACHER}"')))


def test_an_empty_model_init_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"model\.init: String should have at least 1 character"):
        load_recipe(write(tmp_path, MINIMAL.replace("some/model", "''")))


def test_an_empty_path_setting_keeps_its_default(tmp_path, monkeypatch):
    """An empty `EDGEDISTILL_*` path setting is unset (docs/settings.md), so `${...}` gives its default."""
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "")
    recipe = load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", '"${EDGEDISTILL_DATA_DIR}/a.tsv"')))
    assert recipe.data.train == settings.defaults()["EDGEDISTILL_DATA_DIR"] + "/a.tsv"


@pytest.mark.parametrize("written", ["$TASK_DIR/a.tsv", "${TASK_DIR:-.}/a.tsv", "${TASK DIR}/a.tsv"])
def test_a_variable_written_as_a_shell_would_is_refused_not_kept(tmp_path, monkeypatch, written):
    monkeypatch.setenv("TASK_DIR", str(tmp_path))
    reference = re.escape(written.removesuffix("/a.tsv"))
    with pytest.raises(RecipeError, match=rf"exp\.yaml: data\.train: {reference} would be kept as written"):
        load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", f'"{written}"')))


def test_a_variable_of_ones_own_under_the_settings_prefix_is_refused(tmp_path, monkeypatch):
    """The server refuses an EDGEDISTILL_* variable it does not know: the recipe says so before any stage runs."""
    monkeypatch.setenv("EDGEDISTILL_MY_DATA", str(tmp_path))
    with pytest.raises(RecipeError, match=r"data\.train: \$\{EDGEDISTILL_MY_DATA\}: EDGEDISTILL_\* names are"):
        load_recipe(write(tmp_path, MINIMAL.replace("train: a.tsv", "train: '${EDGEDISTILL_MY_DATA}/a.tsv'")))


@pytest.mark.parametrize(
    ("variable", "why"),
    [
        ("EDGEDISTILL_THREADS", "the benchmarks and load tests set for their servers themselves"),
        ("EDGEDISTILL_MAX_BATCH_SIZE", "the servers started in this environment read"),
        ("EDGEDISTILL_TLS_CERT", "the benchmarks and load tests refuse in the environment, as they call"),
    ],
)
def test_a_server_setting_in_a_recipe_is_refused_saying_the_measured_servers_read_it(
    tmp_path, monkeypatch, variable, why
):
    monkeypatch.setenv(variable, "4")
    with pytest.raises(RecipeError, match=rf"\$\{{{variable}\}}: .*{variable} is a server setting, which {why}"):
        load_recipe(write(tmp_path, MINIMAL.replace("train: a.tsv", f"train: '${{{variable}}}/a.tsv'")))


def test_a_pipeline_setting_is_a_variable_a_recipe_may_name(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", str(tmp_path))
    recipe = load_recipe(write(tmp_path, MINIMAL.replace("train: a.tsv", "train: '${EDGEDISTILL_DATA_DIR}/a.tsv'")))
    assert recipe.data.train == f"{tmp_path}/a.tsv"


def test_a_relative_data_dir_setting_resolves_from_the_working_directory(tmp_path, monkeypatch):
    """`EDGEDISTILL_DATA_DIR=../data` is a path from where the commands run, not from the recipe's folder."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "../data")
    (tmp_path / "tasks" / "mine").mkdir(parents=True)
    text = MINIMAL.replace("train: a.tsv", "train: '${EDGEDISTILL_DATA_DIR}/a.tsv'")
    recipe = load_recipe(write(tmp_path / "tasks" / "mine", text))
    assert recipe.data.train == str(tmp_path.resolve() / "data" / "a.tsv")


def test_an_unquoted_variable_inside_brackets_says_to_quote_it(tmp_path):
    text = MINIMAL + "transfer: {unlabelled_files: [${EDGEDISTILL_DATA_DIR}/u.txt]}\n"
    with pytest.raises(RecipeError, match=r"(?s)not valid YAML: .*quote a value that holds \$\{NAME\}"):
        load_recipe(write(tmp_path, text))


def test_other_invalid_yaml_gets_no_hint_about_variables(tmp_path):
    with pytest.raises(RecipeError, match=r"exp\.yaml: not valid YAML: ") as refused:
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: 1\n"))
    assert "quote a value" not in str(refused.value)


def test_an_unquoted_variable_inside_brackets_over_several_lines_says_to_quote_it(tmp_path):
    text = MINIMAL + "transfer:\n  unlabelled_files: [  # one a line\n    ${EDGEDISTILL_DATA_DIR}/u.txt,\n  ]\n"
    with pytest.raises(RecipeError, match=r"(?s)not valid YAML: .*quote a value that holds \$\{NAME\}"):
        load_recipe(write(tmp_path, text))


@pytest.mark.parametrize(
    "text",
    [
        "transfer:\n  text_style: ptb  # SST-2's style\n  unlabelled_files: [${EDGEDISTILL_DATA_DIR}/u.txt]  # reviews' file\n",
        "report: {title: SST-2's run}\ntransfer: {unlabelled_files: [${EDGEDISTILL_DATA_DIR}/u.txt]}  # reviews'\n",
        "transfer: {note: 'run #2', unlabelled_files: [${EDGEDISTILL_DATA_DIR}/u.txt]}\n",
    ],
    ids=["apostrophes in comments", "an apostrophe in a word", "a hash in a quoted string"],
)
def test_quotes_and_comments_around_an_unquoted_variable_inside_brackets_hide_no_hint(tmp_path, text):
    with pytest.raises(RecipeError, match=r"(?s)not valid YAML: .*quote a value that holds \$\{NAME\}"):
        load_recipe(write(tmp_path, MINIMAL + text))


def test_an_escaped_quote_in_a_quoted_string_ends_no_string_so_its_brackets_count_for_nothing(tmp_path):
    text = MINIMAL + "transfer: {note: 'it''s [${EDGEDISTILL_DATA_DIR}', unlabelled_files: !replace [a]}\n"
    with pytest.raises(RecipeError, match=r"!replace marks a mapping") as refused:
        load_recipe(write(tmp_path, text))
    assert "quote a value" not in str(refused.value)


def test_invalid_yaml_beside_a_quoted_variable_gets_no_hint_about_variables(tmp_path):
    text = MINIMAL + 'transfer: {unlabelled_files: !replace ["${EDGEDISTILL_DATA_DIR}/u.txt"]}\n'
    with pytest.raises(RecipeError, match=r"!replace marks a mapping") as refused:
        load_recipe(write(tmp_path, text))
    assert "quote a value" not in str(refused.value)


def test_a_section_written_twice_is_refused_naming_it_and_both_lines(tmp_path):
    text = MINIMAL + "finetune:\n  pooling: mean\nfinetune:\n  optim: {lr: 1}\n"
    with pytest.raises(
        RecipeError, match=r"(?s)'finetune' is written twice in one mapping, here and on line 3.*line 5"
    ):
        load_recipe(write(tmp_path, text))


def test_a_key_written_twice_inside_a_section_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"'lr' is written twice in one mapping"):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {lr: 1, lr: 2}}\n"))


MERGED_STUDENT = """
distill:
  students:
    cnn:
      optim: &student
        <<: {lr: 1.0e-4, epochs: 1}
        lr: 3.0e-3
finetune:
  optim: {<<: *student, epochs: 3}
"""


def test_a_merge_key_naming_a_mapping_built_after_it_takes_that_mappings_own_keys(tmp_path):
    """finetune.optim, built before the student's optim, merges that mapping first: its `lr` is not written twice."""
    assert extend(tmp_path, MERGED_STUDENT).finetune.optim.lr == 3.0e-3


def test_a_key_written_twice_in_a_mapping_a_merge_key_names_first_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"'lr' is written twice in one mapping"):
        extend(tmp_path, MERGED_STUDENT.replace("lr: 3.0e-3", "lr: 3.0e-3\n        lr: 1.0e-3"))


def test_an_unset_variable_in_an_override_names_the_override(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE", raising=False)
    with pytest.raises(RecipeError, match=r"override --data\.dev: unknown setting \$\{NOPE\}"):
        load_recipe(write(tmp_path, MINIMAL), {"data.dev": "${NOPE}/b.tsv"})


def test_dot_slash_paths_resolve_from_the_recipes_folder(tmp_path):
    (tmp_path / "task").mkdir()
    recipe = load_recipe(write(tmp_path / "task", MINIMAL.replace("a.tsv", "./data/a.tsv")))
    assert recipe.data.train == str(tmp_path / "task" / "data" / "a.tsv")


def test_dot_dot_paths_resolve_from_the_recipes_folder(tmp_path):
    (tmp_path / "task").mkdir()
    recipe = load_recipe(write(tmp_path / "task", MINIMAL.replace("some/model", "../models/m")))
    assert recipe.model.init == str(tmp_path / "models" / "m")


def test_relative_paths_in_lists_resolve_too(tmp_path):
    text = MINIMAL + "transfer: {unlabelled_files: [./u1.txt, '${DATA_DIR}/u2.txt']}\n"
    recipe = load_recipe(write(tmp_path, text))
    assert recipe.transfer.unlabelled_files[0] == str(tmp_path / "u1.txt")


def test_a_variable_that_expands_to_a_relative_path_resolves_from_the_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("TASK_DIR", "./trec")
    recipe = load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", '"${TASK_DIR}/a.tsv"')))
    assert recipe.data.train == str(tmp_path / "trec" / "a.tsv")


def test_a_home_path_in_a_recipe_resolves_from_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    recipe = load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", "~/data/a.tsv")))
    assert recipe.data.train == str(tmp_path / "home" / "data" / "a.tsv")


def test_a_home_path_override_resolves_from_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    recipe = load_recipe(write(tmp_path, MINIMAL), {"data.train": "~/x.tsv", "data.dev": "b.tsv"})
    assert recipe.data.train == str(tmp_path / "home" / "x.tsv")


def test_an_override_of_the_train_split_that_keeps_the_recipes_dev_split_is_refused_naming_it(tmp_path):
    with pytest.raises(RecipeError, match=r"--data\.train replaces the recipe's data\.train but keeps its data\.dev"):
        load_recipe(write(tmp_path, MINIMAL), {"data.train": "x.tsv"})


def test_an_override_of_the_train_split_that_keeps_the_recipes_test_split_is_refused_naming_it():
    with pytest.raises(RecipeError, match=r"keeps its data\.test \(\S+trec/test\.tsv\)"):
        load_recipe(ROOT / "recipes" / "trec.yaml", {"data.train": "x.tsv", "data.dev": "y.tsv"})


def test_an_override_of_the_train_split_with_the_recipes_own_file_keeps_its_splits(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL), {"data.train": "a.tsv"}).data.dev == "b.tsv"


def test_an_override_of_the_train_split_with_the_recipes_own_file_written_otherwise_keeps_its_splits(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL), {"data.train": "./a.tsv"}).data.dev == "b.tsv"


def test_an_override_of_the_train_split_with_a_link_to_the_recipes_own_file_keeps_its_splits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "link.tsv").symlink_to(tmp_path / "a.tsv")
    assert load_recipe(write(tmp_path, MINIMAL), {"data.train": "link.tsv"}).data.dev == "b.tsv"


def test_paths_without_a_dot_prefix_are_left_as_written(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL)).data.train == "a.tsv"


def test_a_dot_slash_override_is_left_for_the_working_directory(tmp_path):
    assert load_recipe(write(tmp_path, MINIMAL), {"data.train": "./x.tsv", "data.dev": "b.tsv"}).data.train == (
        "./x.tsv"
    )


def test_a_recipe_with_its_own_train_split_and_the_bases_dev_split_is_refused_naming_both(tmp_path):
    write(tmp_path, MINIMAL, "base.yaml")
    with pytest.raises(RecipeError, match=r"sets data.train but takes data.dev \(.*b.tsv\) from .*base.yaml"):
        load_recipe(write(tmp_path, "extends: base.yaml\ndata: {train: c.tsv}\n"))


def test_a_recipe_with_its_own_train_and_dev_splits_and_the_bases_test_split_is_refused(tmp_path):
    write(tmp_path, MINIMAL.replace("dev: b.tsv", "dev: b.tsv, test: t.tsv"), "base.yaml")
    with pytest.raises(RecipeError, match=r"takes data.test .* null for none"):
        load_recipe(write(tmp_path, "extends: base.yaml\ndata: {train: c.tsv, dev: d.tsv}\n"))


def test_a_recipe_that_renames_the_bases_labels_takes_its_splits(tmp_path):
    write(tmp_path, MINIMAL, "base.yaml")
    assert load_recipe(write(tmp_path, "extends: base.yaml\ndata: {label_names: [bad, good]}\n")).data.dev == "b.tsv"


def test_a_recipe_with_its_own_train_split_and_a_grandparents_dev_split_is_refused_naming_it(tmp_path):
    write(tmp_path, MINIMAL, "base.yaml")
    write(tmp_path, "extends: base.yaml\nfinetune: {optim: {lr: 1e-5}}\n", "middle.yaml")
    with pytest.raises(RecipeError, match=r"takes data.dev \(.*b.tsv\) from .*base.yaml, a recipe it extends"):
        load_recipe(write(tmp_path, "extends: middle.yaml\ndata: {train: c.tsv}\n"))


def test_a_recipe_that_writes_the_bases_train_split_again_takes_its_splits(tmp_path):
    write(tmp_path, MINIMAL, "base.yaml")
    assert load_recipe(write(tmp_path, "extends: base.yaml\ndata: {train: a.tsv}\n")).data.dev == "b.tsv"


def test_a_recipe_that_names_the_bases_train_split_through_a_link_takes_its_splits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "link.tsv").symlink_to(tmp_path / "a.tsv")
    write(tmp_path, MINIMAL, "base.yaml")
    assert load_recipe(write(tmp_path, "extends: base.yaml\ndata: {train: link.tsv}\n")).data.dev == "b.tsv"


def test_a_recipe_that_replaces_the_bases_data_section_takes_no_split_of_it(tmp_path):
    write(tmp_path, MINIMAL, "base.yaml")
    top = "extends: base.yaml\ndata: !replace {train: c.tsv, dev: d.tsv, label_names: [x, y]}\n"
    assert load_recipe(write(tmp_path, top)).data.dev == "d.tsv"


def test_a_recipe_with_its_own_train_split_may_drop_the_bases_test_split(tmp_path):
    write(tmp_path, MINIMAL.replace("dev: b.tsv", "dev: b.tsv, test: t.tsv"), "base.yaml")
    top = "extends: base.yaml\ndata: {train: c.tsv, dev: d.tsv, test: null}\n"
    assert load_recipe(write(tmp_path, top)).data.test is None


def test_a_recipe_with_its_own_train_and_dev_splits_extends_a_base(tmp_path):
    write(tmp_path, MINIMAL, "base.yaml")
    assert load_recipe(write(tmp_path, "extends: base.yaml\ndata: {train: c.tsv, dev: d.tsv}\n")).data.dev == "d.tsv"


def test_a_recipe_that_keeps_the_bases_task_takes_its_splits(tmp_path):
    write(tmp_path, MINIMAL, "base.yaml")
    assert load_recipe(write(tmp_path, "extends: base.yaml\ndata: {metric: macro_f1}\n")).data.dev == "b.tsv"


def test_a_base_recipes_relative_paths_resolve_from_its_own_folder(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "top").mkdir()
    write(tmp_path / "base", MINIMAL.replace("a.tsv", "./a.tsv"), "base.yaml")
    recipe = load_recipe(write(tmp_path / "top", "extends: ../base/base.yaml\n"))
    assert recipe.data.train == str(tmp_path / "base" / "a.tsv")


def test_relative_data_hashes_by_content_wherever_the_recipe_lies(tmp_path):
    """The same task in two checkouts: the data hash names no folder of this machine."""
    for place in ("here", "there"):
        (tmp_path / place).mkdir()
        (tmp_path / place / "train.tsv").write_text("sentence\tlabel\ngood\tgood\n")
        write(
            tmp_path / place,
            "data: {train: ./train.tsv, dev: ./train.tsv, label_names: [bad, good]}\nmodel: {init: some/model}\n",
        )
    here, there = (load_recipe(tmp_path / place / "exp.yaml").section_hash("data") for place in ("here", "there"))
    assert here == there


def test_a_path_that_is_gone_is_hashed_as_written(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\tgood\n")
    recipe = load_recipe(
        write(tmp_path, "data: {train: ./train.tsv, dev: ./train.tsv, label_names: [bad, good]}\nmodel: {init: m/x}\n")
    )
    (tmp_path / "train.tsv").unlink()
    assert recipe.settings("data.train") == {"data.train": str(tmp_path / "train.tsv")}


def test_a_hub_name_is_hashed_as_its_name(tmp_path):
    recipe = load_recipe(write(tmp_path, MINIMAL), {"model.init": "org/model"})
    assert recipe.settings("model.init") == {"model.init": "org/model"}


def test_relative_data_that_changes_changes_the_hash(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\tgood\n")
    path = write(
        tmp_path, "data: {train: ./train.tsv, dev: ./train.tsv, label_names: [bad, good]}\nmodel: {init: m/x}\n"
    )
    before = load_recipe(path).section_hash("data")
    (tmp_path / "train.tsv").write_text("sentence\tlabel\nbad\tbad\n")
    assert load_recipe(path).section_hash("data") != before


def test_data_named_bare_from_the_working_directory_that_changes_changes_the_hash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\tgood\n")
    path = write(tmp_path, "data: {train: train.tsv, dev: train.tsv, label_names: [bad, good]}\nmodel: {init: m/x}\n")
    before = load_recipe(path).section_hash("data")
    (tmp_path / "train.tsv").write_text("sentence\tlabel\nbad\tbad\n")
    assert load_recipe(path).section_hash("data") != before


def _published_teacher(tmp_path):
    """A teacher artifact of another run: a checkpoint published with its manifest, then its card written."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.json").write_text("{}")
    (work / "model.safetensors").write_bytes(b"weights")
    folder = tmp_path / "runs" / "a" / "teacher"
    folder.parent.mkdir(parents=True)
    mf.commit(work, folder, mf.Manifest(stage="teacher", recipe="a", recipe_hash="r", config_hash="c"))
    (folder / mf.CARD).write_text("# teacher\n")
    return folder


def test_a_teacher_artifact_as_init_keeps_its_hash_when_its_card_is_written_again(tmp_path):
    folder = _published_teacher(tmp_path)
    path = write(tmp_path, f"data: {{train: a.tsv, dev: b.tsv, label_names: [bad, good]}}\nmodel: {{init: {folder}}}\n")
    before = load_recipe(path).section_hash("model")
    (folder / mf.CARD).write_text("# teacher\n\nfigures of a later report\n")
    assert load_recipe(path).section_hash("model") == before


def test_a_teacher_artifact_as_init_whose_weights_change_changes_the_hash(tmp_path):
    folder = _published_teacher(tmp_path)
    path = write(tmp_path, f"data: {{train: a.tsv, dev: b.tsv, label_names: [bad, good]}}\nmodel: {{init: {folder}}}\n")
    before = load_recipe(path).section_hash("model")
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert load_recipe(path).section_hash("model") != before


def test_a_checkpoint_folder_named_bare_that_changes_changes_the_hash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "config.json").write_text("{}")
    path = write(tmp_path, "data: {train: a.tsv, dev: b.tsv, label_names: [bad, good]}\nmodel: {init: teacher}\n")
    before = load_recipe(path).section_hash("model")
    (tmp_path / "teacher" / "config.json").write_text('{"hidden_size": 8}')
    assert load_recipe(path).section_hash("model") != before


def test_a_bare_name_of_a_folder_without_a_checkpoint_counts_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench").mkdir()
    path = write(tmp_path, MINIMAL)
    assert load_recipe(path, {"model.init": "bench"}).settings("model.init") == {"model.init": "bench"}


# --- extends: merge, drop, replace ------------------------------------------------------------------------------

BASE = """
data: {train: a.tsv, dev: b.tsv, label_names: [negative, positive]}
model: {init: some/model}
transfer: {unlabelled_files: [u.txt], labeller: teacher-onnx, n_iter: 3}
distill:
  deploy: bilstm
  students:
    bilstm: {model: {arch: bilstm}, optim: {lr: 0.002}}
    cnn: {model: {arch: cnn, num_filters: 50}}
export:
  deploy: bilstm-int8
  bundles:
    teacher-onnx: {source: teacher}
    teacher-int8: {source: teacher, precision: int8}
    bilstm-int8: {source: bilstm, precision: int8}
"""


def extend(tmp_path, text: str):
    write(tmp_path, BASE, "base.yaml")
    return load_recipe(write(tmp_path, "extends: base.yaml\n" + text))


def test_an_int8_labeller_needs_a_relabel_margin(tmp_path):
    with pytest.raises(RecipeError, match="is an INT8 bundle: set transfer.relabel_margin"):
        extend(tmp_path, "transfer: {labeller: teacher-int8}\n")


def test_an_int8_labeller_with_a_margin_loads(tmp_path):
    recipe = extend(tmp_path, "transfer: {labeller: teacher-int8, relabel_margin: 1.0}\n")
    assert recipe.transfer.labeller == "teacher-int8"
    assert recipe.transfer.relabel_margin == 1.0


def test_a_relabel_margin_with_an_fp32_labeller_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="relabel_margin applies to an INT8 labeller"):
        extend(tmp_path, "transfer: {relabel_margin: 1.0}\n")


def test_a_static_int8_labeller_is_refused_since_it_calibrates_on_what_it_labels(tmp_path):
    with pytest.raises(RecipeError, match="static INT8 bundle, which is calibrated on the transfer set it would label"):
        extend(
            tmp_path,
            "transfer: {labeller: teacher-int8, relabel_margin: 1.0}\n"
            "export: {bundles: {teacher-int8: {source: teacher, precision: int8, quantization: static}}}\n",
        )


def test_a_labeller_on_a_gpu_provider_is_refused_since_the_labeller_labels_on_the_cpu(tmp_path):
    with pytest.raises(RecipeError, match=r"has providers CUDAExecutionProvider, CPUExecutionProvider: the labeller"):
        extend(
            tmp_path,
            "transfer: {labeller: teacher-int8, relabel_margin: 1.0}\n"
            "export: {bundles: {teacher-int8: {source: teacher, precision: int8, providers: [cuda, cpu]}}}\n",
        )


def test_an_int8_op_onnx_runtime_does_not_quantize_is_refused_naming_the_nearest():
    overrides = parse_overrides(["--export.bundles.transformer-int8.int8_ops=[Matmul]"])
    with pytest.raises(
        RecipeError, match=r"transformer-int8\.int8_ops: 'Matmul' is no operator type .* did you mean MatMul\? "
    ):
        load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


def test_the_dynamic_int8_ops_named_are_those_onnx_runtime_quantizes():
    assert set(IntegerOpsRegistry) == set(DYNAMIC_INT8_OPS)


def with_providers(providers: str):
    """The smoke recipe with its `bilstm-fp32` bundle on `providers` (a YAML list)."""
    overrides = parse_overrides([f"--export.bundles.bilstm-fp32.providers={providers}"])
    return load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)


def test_a_provider_onnx_runtime_has_in_no_build_is_refused_naming_the_nearest():
    with pytest.raises(
        RecipeError,
        match=r"bilstm-fp32\.providers: 'CPUExecutionProvder' is no ONNX Runtime execution provider, in any "
        r"build: did you mean CPUExecutionProvider\? ",
    ):
        with_providers("[CPUExecutionProvder]")


def test_a_provider_alias_is_taken_by_its_full_name():
    assert with_providers("[CUDA, cpu]").export.bundles["bilstm-fp32"].providers == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]


def test_a_provider_hashes_alike_by_its_alias_and_its_full_name():
    def hashed(providers: str) -> str:
        return with_providers(providers).section_hash("export.bundles.bilstm-fp32")

    assert hashed("[cpu]") == hashed("[CPUExecutionProvider]")


def test_a_provider_after_the_cpus_is_refused_as_one_that_would_run_nothing():
    with pytest.raises(
        RecipeError,
        match=r"bilstm-fp32\.providers: .*CUDAExecutionProvider after CPUExecutionProvider would run nothing: ONNX "
        r"Runtime gives each node to the first provider that takes it",
    ):
        with_providers("[cpu, CUDAExecutionProvider]")


def test_a_provider_named_twice_by_its_alias_and_its_full_name_is_refused():
    with pytest.raises(RecipeError, match=r"bilstm-fp32\.providers: .*CUDAExecutionProvider is named twice"):
        with_providers("[cuda, CUDAExecutionProvider]")


def test_an_architecture_without_its_arch_settings_row_is_refused_naming_the_row(monkeypatch):
    monkeypatch.delitem(training.ARCH_SETTINGS, "cnn")  # an architecture added without it (docs/extending.md)
    with pytest.raises(RecipeError, match="arch 'cnn' has no ARCH_SETTINGS row in common/config/training.py"):
        load_recipe(SMOKE)


def test_the_providers_named_are_those_onnx_runtime_has():
    assert set(get_all_providers()) == set(PROVIDERS)


@pytest.mark.parametrize("key", ["per_channel: true", "int8_ops: [MatMul]"])
def test_static_int8_refuses_the_dynamic_settings_it_would_ignore(tmp_path, key):
    with pytest.raises(
        RecipeError,
        match=r"quantization: static quantizes MatMul and Conv \(and a GPT teacher's Gemm\) with weights per channel",
    ):
        extend(
            tmp_path,
            f"export: {{bundles: {{t8: {{source: teacher, precision: int8, quantization: static, {key}}}}}}}\n",
        )


def test_an_opset_the_exporter_cannot_write_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="export.opset"):
        extend(tmp_path, "export: {opset: 30}\n")


def test_a_relabel_margin_without_a_labeller_is_refused(tmp_path):
    with pytest.raises(RecipeError, match="relabel_margin is set but transfer.labeller is not"):
        extend(tmp_path, "transfer: {labeller: null, relabel_margin: 1.0}\n")


def test_a_misspelt_labeller_names_the_bundles_that_can_label(tmp_path):
    message = r"labeller='teacher-int8x' is not one of export\.bundles: did you mean teacher-int8\? the teacher's CPU "
    with pytest.raises(RecipeError, match=message + r"bundles that can label are teacher-onnx, teacher-int8, or"):
        extend(tmp_path, "transfer: {labeller: teacher-int8x, relabel_margin: 1.0}\n")


def test_a_labeller_without_bundles_says_pytorch_labels_without_one(tmp_path):
    with pytest.raises(RecipeError, match=r"has no fp32 or INT8 CPU bundle of the teacher to label with: transfer\."):
        extend(tmp_path, "transfer: {labeller: teacher-int8, relabel_margin: 1.0}\nexport: null\n")


def test_a_student_bundle_cannot_label(tmp_path):
    with pytest.raises(RecipeError, match="must be an fp32 or INT8 ONNX Runtime bundle of the teacher"):
        extend(tmp_path, "transfer: {labeller: bilstm-int8, relabel_margin: 1.0}\n")


def test_null_drops_a_student(tmp_path):
    assert set(extend(tmp_path, "distill: {students: {cnn: null}}\n").distill.students) == {"bilstm"}


def test_dropping_every_student_is_refused_naming_the_section_to_drop_instead(tmp_path):
    with pytest.raises(RecipeError, match=r"distill\.students: none left: .* to build none \(distill: null\)"):
        extend(tmp_path, "distill: {students: {cnn: null, bilstm: null}}\n")


def test_students_set_to_null_are_refused_naming_the_section_to_drop_instead(tmp_path):
    with pytest.raises(RecipeError, match=r"distill\.students: none left: .* to build none \(distill: null\)"):
        extend(tmp_path, "distill: {students: null}\n")


def test_dropping_every_bundle_is_refused_naming_the_section_to_drop_instead(tmp_path):
    with pytest.raises(RecipeError, match=r"export\.bundles: none left: .* to build none \(export: null\)"):
        extend(tmp_path, "export: {bundles: {teacher-onnx: null, teacher-int8: null, bilstm-int8: null}}\n")


def test_dropping_the_distill_and_export_sections_loads_a_teacher_only_recipe(tmp_path):
    assert extend(tmp_path, "transfer: null\ndistill: null\nexport: null\n").distill is None


def test_a_bundle_of_a_dropped_student_is_refused_naming_the_students_left(tmp_path):
    with pytest.raises(RecipeError, match=r"'bilstm' is neither teacher nor one of distill.students \['cnn'\]"):
        extend(tmp_path, "distill: {deploy: cnn, students: {bilstm: null}}\n")


def test_a_transformer_student_copying_a_gpt_teacher_is_refused_at_load(tmp_path):
    student = "distill: {students: {small: {model: {arch: transformer, hidden_size: 64, num_heads: 2}}}}\n"
    with pytest.raises(RecipeError, match="distill.students.small is a transformer that starts from"):
        extend(tmp_path, "model: {family: gpt}\n" + student)


def test_a_smoothed_bundle_of_a_gpt_teacher_is_refused_at_load(tmp_path):
    smoothed = "{source: teacher, precision: int8, per_channel: true, int8_ops: [MatMul], smooth: 0.85}"
    with pytest.raises(RecipeError, match="export.bundles.teacher-int8.smooth needs a bert teacher"):
        extend(tmp_path, "model: {family: gpt}\nexport: {bundles: {teacher-int8: " + smoothed + "}}\n")


@pytest.mark.parametrize("choice", ["attention: MultiHeadAttention", "skip_layer_norm: false"])
def test_a_fusion_choice_in_a_bundle_of_a_gpt_teacher_is_refused_at_load(tmp_path, choice):
    bundle = "{source: teacher, precision: int8, " + choice + "}"
    with pytest.raises(RecipeError, match=rf"export\.bundles\.teacher-int8\.{choice.split(':')[0]} would not apply"):
        extend(tmp_path, "model: {family: gpt}\nexport: {bundles: {teacher-int8: " + bundle + "}}\n")


def test_a_gpt_recipe_extending_sst2_loads_with_its_own_bundles():
    assert load_recipe(ROOT / "recipes" / "sst2-gpt.yaml").model.family == "gpt"


def test_a_transformer_student_of_a_gpt_teacher_starting_afresh_loads(tmp_path):
    fresh = "{model: {arch: transformer, hidden_size: 64, num_heads: 2}, init_from_teacher: false}"
    recipe = extend(tmp_path, "model: {family: gpt}\ndistill: {students: {small: " + fresh + "}}\n")
    assert "small" in recipe.distill.students


def test_null_for_a_student_the_base_lacks_is_refused_naming_those_it_has(tmp_path):
    with pytest.raises(RecipeError, match=r"distill.students.transformer: null drops nothing.*\['bilstm', 'cnn'\]"):
        extend(tmp_path, "distill: {students: {transformer: null}}\n")


def test_null_for_a_student_the_base_lacks_is_refused_naming_the_file_it_is_written_in(tmp_path):
    with pytest.raises(RecipeError, match=r"exp\.yaml: distill\.students\.transformer: null drops nothing"):
        extend(tmp_path, "distill: {students: {transformer: null}}\n")


BARE_BASE = "data: {train: a.tsv, dev: b.tsv, label_names: [negative, positive]}\nmodel: {init: some/model}\n"


def test_null_for_a_student_under_a_section_the_base_lacks_is_refused_as_dropping_nothing(tmp_path):
    write(tmp_path, BARE_BASE, "base.yaml")
    recipe = write(tmp_path, "extends: base.yaml\ndistill: {deploy: cnn, students: {cnn: null}}\n")
    with pytest.raises(RecipeError, match=r"distill\.students\.cnn: null drops nothing: the base recipe has no 'cnn'"):
        load_recipe(recipe)


def test_null_for_a_setting_under_a_section_the_base_lacks_sets_it(tmp_path):
    write(tmp_path, BARE_BASE, "base.yaml")
    recipe = load_recipe(
        write(tmp_path, "extends: base.yaml\ntransfer: {unlabelled_files: [u.txt], relabel_margin: null}\n")
    )
    assert recipe.transfer.relabel_margin is None


@pytest.mark.parametrize(
    ("section", "text"),
    [
        ("export.bundles", "export: {bundles: {on: {source: teacher}}}\n"),
        ("distill.students", "distill: {students: {yes: {model: {arch: cnn}}}}\n"),
    ],
)
def test_a_name_yaml_reads_as_a_boolean_is_refused_saying_to_quote_it(tmp_path, section, text):
    with pytest.raises(
        RecipeError, match=rf"exp\.yaml: {re.escape(section)}: a name read as a boolean, True: .* quote it"
    ):
        extend(tmp_path, text)


def test_a_name_yaml_reads_as_false_is_shown_quoted_as_a_false_word(tmp_path):
    with pytest.raises(RecipeError, match=re.escape('quote it ("off": for off:)')):
        extend(tmp_path, "export: {bundles: {off: {source: teacher}}}\n")


def test_a_setting_yaml_reads_as_false_is_shown_quoted_as_a_false_word(tmp_path):
    with pytest.raises(RecipeError, match=re.escape("""deploy: "off" in a recipe, --distill.deploy='"off"'""")):
        extend(tmp_path, "distill: {deploy: off}\n")


def test_an_override_into_a_section_the_recipe_sets_to_null_names_the_file_and_the_null(tmp_path):
    path = write(tmp_path, MINIMAL + "pretrain: null\n")
    with pytest.raises(RecipeError, match=r"exp\.yaml: override --pretrain\.seq_len: the recipe sets pretrain to null"):
        load_recipe(path, parse_overrides(["--pretrain.seq_len=64"]))


def test_null_for_a_section_the_base_lacks_sets_nothing_up(tmp_path):
    assert extend(tmp_path, "pretrain: null\n").pretrain is None


def test_null_drops_a_bundle(tmp_path):
    assert set(extend(tmp_path, "export: {bundles: {teacher-int8: null}}\n").export.bundles) == {
        "teacher-onnx",
        "bilstm-int8",
    }


def test_null_drops_a_whole_section(tmp_path):
    text = "transfer: null\ndistill: null\nexport: null\n"
    assert extend(tmp_path, text).distill is None


TEACHER_ALONE = "transfer: null\ndistill: null\nexport:\n  deploy: teacher-int8\n"


def test_a_teacher_alone_with_its_bundles_loads(tmp_path):
    recipe = extend(tmp_path, TEACHER_ALONE + "  bundles: {bilstm-int8: null}\n")
    assert set(recipe.export.bundles) == {"teacher-onnx", "teacher-int8"}


def test_students_without_a_transfer_set_are_refused(tmp_path):
    with pytest.raises(RecipeError, match="distill read the transfer set"):
        extend(tmp_path, "transfer: null\n")


def test_a_static_int8_bundle_without_a_transfer_set_is_refused(tmp_path):
    text = TEACHER_ALONE + "  bundles: {bilstm-int8: null, teacher-int8: {quantization: static}}\n"
    with pytest.raises(RecipeError, match="export.bundles.teacher-int8 read the transfer set"):
        extend(tmp_path, text)


def test_a_cascade_with_every_unlabelled_line_read_by_the_transfer_set_is_refused_naming_both_keys(tmp_path):
    write(tmp_path, "extends: smoke\ntransfer: {unlabelled_max_lines: null}\n")
    with pytest.raises(RecipeError, match=r"export\.cascades .*transfer\.unlabelled_max_lines is unset"):
        load_recipe(tmp_path / "exp.yaml")


@pytest.mark.parametrize(
    ("setting", "named"),
    [("rule: margin", "rule: margin"), ("temperature_scaling: false", "temperature_scaling: false")],
)
def test_a_cascade_routing_choice_of_a_two_label_task_is_refused_as_changing_nothing(tmp_path, setting, named):
    text = f"extends: smoke\nexport:\n  cascades:\n    bilstm-cascade: {{{setting}}}\n"
    with pytest.raises(RecipeError, match=rf"export\.cascades\.bilstm-cascade: {named} would not apply"):
        load_recipe(write(tmp_path, text))


def test_a_cascade_routing_choice_of_a_task_of_three_labels_is_taken(tmp_path):
    text = "extends: smoke\ndata: {label_names: [a, b, c]}\nexport:\n  cascades:\n    bilstm-cascade: {rule: margin}\n"
    assert load_recipe(write(tmp_path, text)).export.cascades["bilstm-cascade"].rule == "margin"


def test_a_cascade_without_a_transfer_set_is_refused(tmp_path):
    text = (
        TEACHER_ALONE + "  bundles: {bilstm-int8: null}\n  cascades: {pair: {members: [teacher-int8, teacher-onnx]}}\n"
    )
    with pytest.raises(RecipeError, match="export.cascades.pair read the transfer set"):
        extend(tmp_path, text)


def test_null_sets_a_nullable_scalar_to_null(tmp_path):
    assert extend(tmp_path, "transfer: {labeller: null}\n").transfer.labeller is None


def test_null_on_a_scalar_keeps_the_rest_of_its_section(tmp_path):
    assert extend(tmp_path, "transfer: {labeller: null}\n").transfer.n_iter == 3


def test_null_sets_the_teacher_init_to_null(tmp_path):
    text = "model: {init: null}\npretrain: {train_files: [t.txt]}\n"
    assert extend(tmp_path, text).model.init is None


def test_dropping_the_deployed_student_names_the_broken_rule(tmp_path):
    with pytest.raises(RecipeError, match=r"distill\.deploy=bilstm is not one of distill\.students \(cnn\): name one"):
        extend(tmp_path, "distill: {students: {bilstm: null}}\nexport: null\n")


def test_sections_still_merge_key_by_key(tmp_path):
    assert (
        extend(tmp_path, "distill: {students: {cnn: {optim: {lr: 0.01}}}}\n").distill.students["cnn"].model.num_filters
        == 50
    )


def test_replace_tag_replaces_a_whole_entry(tmp_path):
    recipe = extend(tmp_path, "distill: {students: {cnn: !replace {model: {arch: cnn}}}}\n")
    assert recipe.distill.students["cnn"].model.num_filters == 100


def test_replace_tag_replaces_a_whole_section(tmp_path):
    text = "export: !replace {deploy: teacher-onnx, bundles: {teacher-onnx: {source: teacher}}}\n"
    assert set(extend(tmp_path, text).export.bundles) == {"teacher-onnx"}


def test_replace_tag_marks_only_mappings(tmp_path):
    with pytest.raises(RecipeError, match="not valid YAML: !replace marks a mapping"):
        extend(tmp_path, "model: {init: !replace other/model}\n")


def test_extends_a_recipe_in_recipes_by_its_bare_name(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "/data")
    recipe = load_recipe(write(tmp_path, "extends: sst2\nfinetune: {optim: {lr: 0.5}}\n"))
    assert recipe.data.train == "/data/sst2/train.tsv"


def test_extends_an_absolute_path(tmp_path):
    write(tmp_path, BASE, "base.yaml")
    (tmp_path / "elsewhere").mkdir()
    recipe = load_recipe(write(tmp_path / "elsewhere", f"extends: {tmp_path / 'base.yaml'}\n"))
    assert recipe.distill.deploy == "bilstm"


def test_extends_a_path_from_a_variable(tmp_path, monkeypatch):
    write(tmp_path, BASE, "base.yaml")
    monkeypatch.setenv("RECIPE_BASES", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    recipe = load_recipe(write(tmp_path / "elsewhere", "extends: ${RECIPE_BASES}/base.yaml\n"))
    assert recipe.distill.deploy == "bilstm"


def test_extends_a_missing_recipe_says_where_it_looked(tmp_path):
    with pytest.raises(RecipeError, match=r"extends nope, which does not exist; .* \(one of .*, from .*recipes\)"):
        load_recipe(write(tmp_path, "extends: nope\n"))


def test_extends_a_bare_name_of_a_file_beside_the_recipe_suggests_the_file(tmp_path):
    write(tmp_path, BASE, "base.yaml")
    with pytest.raises(RecipeError, match=r"extends base, which does not exist; did you mean extends: base\.yaml, "):
        load_recipe(write(tmp_path, "extends: base\n"))


def test_extends_in_a_cycle_is_refused(tmp_path):
    write(tmp_path, "extends: b.yaml\n", "a.yaml")
    write(tmp_path, "extends: a.yaml\n", "b.yaml")
    with pytest.raises(RecipeError, match="extends itself"):
        load_recipe(tmp_path / "a.yaml")


def test_a_recipe_of_a_shipped_recipes_name_extends_the_shipped_one_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    recipe = load_recipe(write(tmp_path / "recipes", "extends: trec\nfinetune: {optim: {lr: 1e-5}}\n", "trec.yaml"))
    assert recipe.data.label_names == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]


def test_a_recipe_that_alone_has_the_name_it_extends_is_refused_as_extending_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    with pytest.raises(RecipeError, match="extends mine, which names this recipe itself"):
        load_recipe(write(tmp_path / "recipes", "extends: mine\n", "mine.yaml"))


def test_a_recipe_extending_its_own_file_name_is_refused_as_extending_itself_not_pointed_to_itself(tmp_path):
    with pytest.raises(RecipeError, match="extends mine, which names this recipe itself"):
        load_recipe(write(tmp_path, "extends: mine\n", "mine.yaml"))


def test_the_extending_recipe_keeps_its_own_name(tmp_path):
    assert extend(tmp_path, "").name == "exp"


# --- the recipes docs/tasks.md shows -----------------------------------------------------------------------------


def documented_recipes() -> dict[str, str]:
    """File name -> text of each ```yaml block in docs/tasks.md that opens with `# <name>.yaml:`."""
    text = (ROOT / "docs" / "tasks.md").read_text(encoding="utf-8")
    return dict(re.findall(r"```yaml\n(?=# (\S+\.yaml):)(.*?)```", text, flags=re.DOTALL))


@pytest.fixture
def documented(tmp_path, monkeypatch):
    """The documented recipes, written side by side (one extends the other), loaded by name."""
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "/data")
    for name, text in documented_recipes().items():
        write(tmp_path, text, name)
    return lambda name: load_recipe(tmp_path / name)


def test_the_tasks_page_shows_the_trec_and_mrpc_recipes():
    assert set(documented_recipes()) == {"my-trec.yaml", "my-mrpc.yaml"}


def test_documented_trec_recipe_reads_six_labels(documented):
    assert documented("my-trec.yaml").data.num_labels == 6


def test_documented_trec_recipe_keeps_two_of_the_base_students(documented):
    assert set(documented("my-trec.yaml").distill.students) == {"cnn-small", "bilstm"}


def test_documented_trec_recipe_replaces_the_bundles(documented):
    assert set(documented("my-trec.yaml").export.bundles) == {"teacher-int8", "bilstm-int8", "cnn-small-folded"}


def test_documented_trec_recipe_smooths_its_int8_labeller_as_the_base_does(documented):
    assert documented("my-trec.yaml").export.bundles["teacher-int8"].smooth == 0.85


def test_documented_mrpc_recipe_labels_with_the_fp32_graph_it_builds(documented):
    recipe = documented("my-mrpc.yaml")
    assert recipe.export.bundles[recipe.transfer.labeller].precision == "fp32"


def test_documented_trec_recipe_writes_raw_transfer_text(documented):
    assert documented("my-trec.yaml").transfer.text_style == "raw"


def test_documented_mrpc_recipe_is_a_pair_task(documented):
    assert documented("my-mrpc.yaml").data.pairs


def test_documented_mrpc_recipe_selects_on_the_paraphrase_f1(documented):
    assert documented("my-mrpc.yaml").data.positive_index == 1


def test_a_student_key_the_data_sets_is_refused_naming_it(tmp_path):
    with pytest.raises(RecipeError, match=r"distill.students.cnn.model sets \['num_labels'\]: the stage sets these"):
        extend(tmp_path, "distill: {students: {cnn: {model: {arch: cnn, num_labels: 7}}}}\n")


@pytest.mark.parametrize(
    "section, key",
    [
        ("transfer: {unlabelled_files: [u.txt, export.jsonl]}", "transfer.unlabelled_files: export.jsonl"),
        ("transfer: {unlabelled_files: [dump.CSV.gz]}", "transfer.unlabelled_files: dump.CSV.gz"),
        ("pretrain: {train_files: [u.txt], eval_files: [held.tsv]}", "pretrain.eval_files: held.tsv"),
        ("transfer: {unlabelled_files: [reviews.json]}", "transfer.unlabelled_files: reviews.json"),
    ],
)
def test_a_text_file_setting_naming_a_labelled_data_format_is_refused(tmp_path, section, key):
    with pytest.raises(RecipeError, match=rf"exp\.yaml: {re.escape(key)} would be read line by line as plain text"):
        load_recipe(write(tmp_path, MINIMAL + section + "\n"))


def test_augmentation_that_leaves_every_sample_equal_to_its_example_is_refused():
    zero = {"transfer.p_mask": 0.0, "transfer.p_replace": 0.0, "transfer.p_ngram": 0.0}
    with pytest.raises(RecipeError, match=r"transfer.n_iter=20 draws samples that p_mask, p_replace and p_ngram"):
        load_recipe(SMOKE, zero | {"transfer.n_iter": 20})


def test_no_augmentation_takes_probabilities_of_0():
    zero = {"transfer.p_mask": 0.0, "transfer.p_replace": 0.0, "transfer.p_ngram": 0.0}
    assert load_recipe(SMOKE, zero | {"transfer.n_iter": 0}).transfer.n_iter == 0


@pytest.mark.parametrize("n_iter, masks", [(0, 0.0), (20, 0.1)])
def test_augmentation_masks_words_only_where_it_draws_samples(n_iter, masks):
    assert load_recipe(SMOKE, {"transfer.n_iter": n_iter, "transfer.p_mask": 0.1}).transfer.masks == masks


def test_a_temperature_without_the_soft_target_loss_is_refused():
    with pytest.raises(RecipeError, match=r"temperature=8 would change nothing: only the kd loss reads it"):
        load_recipe(SMOKE, {"distill.students.cnn.temperature": 8.0, "distill.students.cnn.losses": {"mse": 1.0}})


def test_a_temperature_with_the_soft_target_loss_is_taken():
    recipe = load_recipe(SMOKE, {"distill.students.cnn.temperature": 8.0, "distill.students.cnn.losses": {"kd": 1.0}})
    assert recipe.distill.students["cnn"].temperature == 8.0


@pytest.mark.parametrize("term", ["hidden", "attention"])
def test_layer_losses_for_a_student_without_layers_are_refused_at_load(tmp_path, term):
    student = "{model: {arch: bilstm}, losses: {" + term + ": 1.0}}"
    with pytest.raises(RecipeError, match=rf"distill.students.small.*\['{term}'\].*a bilstm student has none"):
        extend(tmp_path, "distill: {students: {small: " + student + "}}\n")


def test_a_term_the_loss_weights_count_as_layered_is_refused_at_load_for_a_student_without_layers(monkeypatch):
    monkeypatch.setattr(training.LossWeights, "layered", property(lambda self: ["kd"] if self.kd else []))
    with pytest.raises(RecipeError, match=r"distill.students.cnn.*\['kd'\].*a cnn student has none"):
        load_recipe(SMOKE, {"distill.students.cnn.losses.kd": 1.0})


def test_a_student_whose_loss_weights_are_all_zero_is_refused_at_load(tmp_path):
    student = "{model: {arch: cnn}, losses: {mse: 0}}"
    with pytest.raises(RecipeError, match=r"distill.students.small.losses: .*every loss weight is 0"):
        extend(tmp_path, "distill: {students: {small: " + student + "}}\n")


@pytest.mark.parametrize("layers", ["hidden: 1", "attention: 1", "hidden: 1, attention: 1"])
def test_a_student_whose_only_weighted_losses_are_layer_losses_is_refused_at_load(tmp_path, layers):
    student = "{model: {arch: transformer}, losses: {mse: 0, " + layers + "}}"
    with pytest.raises(RecipeError, match=r"distill.students.small.losses: .*not its classifier.*give kd, mse or ce"):
        extend(tmp_path, "distill: {students: {small: " + student + "}}\n")


@pytest.mark.parametrize("term", ["kd", "mse", "ce"])
def test_a_student_with_layer_losses_and_one_logit_loss_loads(term):
    losses = {"kd": 0.0, "mse": 0.0, "ce": 0.0, "hidden": 1.0} | {term: 0.5}
    recipe = load_recipe(SMOKE, {"distill.students.transformer.losses": losses})
    assert getattr(recipe.distill.students["transformer"].losses, term) == 0.5


def test_a_pair_column_that_is_the_text_column_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.text_column and data\.text_pair_column both name the column 'a'"):
        load_recipe(write(tmp_path, MINIMAL), {"data.text_column": "a", "data.text_pair_column": "a"})


def test_a_pair_column_that_is_the_label_column_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.label_column and data\.text_pair_column both name the column 'y'"):
        load_recipe(write(tmp_path, MINIMAL), {"data.label_column": "y", "data.text_pair_column": "y"})


def test_a_label_column_that_is_the_text_column_is_refused(tmp_path):
    with pytest.raises(RecipeError, match=r"data\.text_column and data\.label_column both name the column 'label'"):
        load_recipe(write(tmp_path, MINIMAL), {"data.text_column": "label"})


@pytest.mark.parametrize("arch", ["bilstm", "cnn"])
def test_layer_decay_for_a_student_without_transformer_layers_is_refused_at_load(tmp_path, arch):
    student = "{model: {arch: " + arch + "}, optim: {layer_decay: 0.8}}"
    with pytest.raises(RecipeError, match=rf"distill.students.small: optim.layer_decay .*a {arch} student has none"):
        extend(tmp_path, "distill: {students: {small: " + student + "}}\n")


def test_layer_decay_for_a_transformer_student_is_taken(tmp_path):
    student = "{model: {arch: transformer, hidden_size: 64, num_heads: 2}, optim: {layer_decay: 0.8}}"
    recipe = extend(tmp_path, "distill: {students: {small: " + student + "}}\n")
    assert recipe.distill.students["small"].optim.layer_decay == 0.8


SMOKE = ROOT / "recipes" / "smoke.yaml"


def refusal(overrides: dict, command: str = "bench serving") -> str:
    """The error `command` (run as `edgedistill <command>`) gives for `overrides` of recipes/smoke.yaml."""
    with pytest.raises(RecipeError) as refused:
        load_command_recipe(SMOKE, overrides, command, f"edgedistill {command}")
    return str(refused.value)


def test_an_override_of_a_section_the_command_does_not_read_names_the_override():
    assert refusal({"runtime.device": "cuda"}).startswith("--runtime.device: ")


def test_an_override_of_a_section_the_command_does_not_read_names_the_command():
    assert "edgedistill bench serving reads no runtime setting" in refusal({"runtime.device": "cuda"})


def test_an_override_of_a_section_the_command_does_not_read_names_the_sections_it_reads():
    assert "(it reads name, data, export.deploy, tracking, bench.serving)" in refusal({"runtime.device": "cuda"})


def test_an_override_of_another_benchmarks_subsection_is_refused():
    assert "reads no bench.peers setting" in refusal({"bench.peers.workers": 1})


def test_an_override_of_a_benchmark_section_is_refused_by_the_teacher():
    assert "edgedistill teacher reads no bench.serving setting" in refusal({"bench.serving.threads": 4}, "teacher")


def test_a_precision_override_is_refused_by_the_model_benchmark_which_times_in_fp32():
    refused = refusal({"runtime.precision": "fp16"}, "bench models")
    assert refused.startswith("--runtime.precision: edgedistill bench models reads no runtime.precision setting")


def test_a_device_override_is_taken_by_the_model_benchmark():
    recipe = load_command_recipe(SMOKE, {"runtime.device": "cpu"}, "bench models", "edgedistill bench models")
    assert recipe.runtime.device == "cpu"


def test_every_override_a_command_does_not_read_is_named():
    assert "--tracking: " in refusal({"runtime.device": "cuda", "tracking": "mlflow"}, "headline")


def test_an_override_needed_only_beside_another_unread_one_is_refused_with_it():
    extra = {"distill.students.extra.model.arch": "cnn", "distill.deploy": "extra"}
    assert "--distill.students.extra.model.arch: " in refusal(extra)


SMOKE_LOADTEST = "loadtest --profile smoke"


def test_an_override_of_another_profiles_settings_is_refused_by_a_load_test():
    assert "reads no loadtest.steady setting" in refusal({"loadtest.steady.rate": 5.0}, SMOKE_LOADTEST)


def test_an_override_of_another_profiles_settings_names_the_load_test_that_reads_it():
    refused = refusal({"loadtest.steady.rate": 5.0}, SMOKE_LOADTEST)
    assert refused.endswith("drop it, or give it to edgedistill loadtest --profile steady")


def test_an_override_of_another_benchmarks_subsection_names_the_benchmark_that_reads_it():
    assert refusal({"bench.peers.workers": 1}).endswith("drop it, or give it to edgedistill bench peers")


def test_an_override_of_how_a_bundle_is_built_is_refused_by_a_benchmark():
    assert "reads no export.bundles setting" in refusal({"export.bundles.cnn-folded.precision": "int8"})


def test_an_override_of_a_section_a_benchmark_reads_part_of_names_no_command_that_reads_it_whole():
    assert refusal({"export.opset": 18}).endswith("change nothing: drop it")


def test_an_override_of_the_near_tie_margin_names_the_benchmark_that_reads_it():
    assert refusal({"export.tie_margin": 0.1}).endswith("drop it, or give it to edgedistill bench accuracy")


def test_an_override_of_the_deployed_bundle_is_taken_by_a_benchmark():
    recipe = load_command_recipe(SMOKE, {"export.deploy": "cnn-int8"}, "bench serving", "edgedistill bench serving")
    assert recipe.export.deploy == "cnn-int8"


@pytest.mark.parametrize("command", ["report", "headline"])
def test_the_report_and_the_headline_show_no_override_example(command):
    assert "e.g." not in overrides_help(command)


def test_an_override_of_a_section_no_command_shares_names_no_command_that_reads_it():
    assert refusal({"finetune.optim.lr": 1e-4}).endswith("change nothing: drop it")


def test_a_device_override_refused_by_a_benchmark_of_a_bundle_names_the_model_benchmark():
    assert refusal({"runtime.device": "cuda"}).endswith("drop it, or give it to edgedistill bench models")


def test_an_override_of_a_load_tests_own_profile_is_taken():
    recipe = load_command_recipe(SMOKE, {"loadtest.smoke.rate": 5.0}, SMOKE_LOADTEST, "edgedistill loadtest")
    assert recipe.loadtest.smoke.rate == 5.0


def test_an_override_of_a_setting_every_profile_shares_is_taken_by_a_load_test():
    recipe = load_command_recipe(SMOKE, {"loadtest.timeout_s": 5.0}, SMOKE_LOADTEST, "edgedistill loadtest")
    assert recipe.loadtest.timeout_s == 5.0


def test_an_override_of_a_teacher_bundles_fusion_is_taken_by_the_teacher():
    # a teacher ONNX Runtime fuses only in part is refused before it trains unless its bundles say fused: false
    unfused = {"export.bundles.teacher-fused.fused": False}
    recipe = load_command_recipe(SMOKE, unfused, "teacher", "edgedistill teacher")
    assert recipe.export.bundles["teacher-fused"].fused is False


def test_an_override_of_a_section_the_command_reads_is_taken():
    recipe = load_command_recipe(SMOKE, {"bench.serving.threads": 4}, "bench serving", "edgedistill bench serving")
    assert recipe.bench.serving.threads == 4


def test_an_override_of_a_parents_section_is_taken():
    recipe = load_command_recipe(SMOKE, {"finetune.optim.lr": 1e-4}, "distill", "edgedistill distill")
    assert recipe.finetune.optim.lr == 1e-4


def test_an_override_the_recipe_needs_to_load_is_taken_by_a_command_that_does_not_read_it():
    gpt = {"model.family": "gpt", "distill.students.transformer.init_from_teacher": False}
    assert load_command_recipe(SMOKE, gpt, "teacher", "edgedistill teacher").model.family == "gpt"


def test_an_environment_variable_that_sets_a_section_the_command_does_not_read_is_taken(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cpu")
    assert load_command_recipe(SMOKE, {}, "bench serving", "edgedistill bench serving").runtime.device == "cpu"


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"precision": "fp32", "per_channel": True}, "per_channel"),
        ({"precision": "fp32", "int8_ops": ["MatMul"]}, "int8_ops"),
        ({"precision": "fp16", "quantization": "static"}, "quantization"),
        ({"runtime": "tensorrt", "fused": False}, "fused"),
        ({"runtime": "tensorrt", "attention": "MultiHeadAttention"}, "attention"),
        ({"runtime": "tensorrt", "skip_layer_norm": False}, "skip_layer_norm"),
        ({"runtime": "tensorrt", "precision": "int8", "quantization": "static"}, "quantization"),
        ({"runtime": "tensorrt", "precision": "int8", "per_channel": True}, "per_channel"),
        ({"runtime": "tensorrt", "precision": "int8", "int8_ops": ["MatMul"]}, "int8_ops"),
        ({"runtime": "tensorrt", "providers": ["CUDAExecutionProvider"]}, "providers"),
        ({"precision": "int8", "int8_ops": ["Gather"], "per_channel": True}, "per_channel"),
        ({"precision": "int8", "int8_ops": ["Conv", "EmbedLayerNormalization"], "per_channel": True}, "per_channel"),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(map(str, value.values())),
)
def test_a_bundle_setting_its_precision_or_runtime_would_not_apply_is_refused_naming_it(settings, key):
    bundle = {"export.bundles.extra.source": "teacher"} | {f"export.bundles.extra.{k}": v for k, v in settings.items()}
    with pytest.raises(RecipeError, match=rf"export\.bundles\.extra: {key} would not apply"):
        load_recipe(SMOKE, bundle)


@pytest.mark.parametrize("student", ["bilstm", "cnn"])
def test_smoothing_a_student_whose_graph_is_not_fused_is_refused_at_load(student):
    smoothed = {"source": student, "precision": "int8", "smooth": 0.5}
    with pytest.raises(RecipeError, match=r"export\.bundles\.extra\.smooth needs a fused graph"):
        load_recipe(SMOKE, {f"export.bundles.extra.{k}": v for k, v in smoothed.items()})


@pytest.mark.parametrize("student", ["bilstm", "cnn"])
@pytest.mark.parametrize("key, value", [("attention", "MultiHeadAttention"), ("skip_layer_norm", False)])
def test_a_fusion_choice_for_a_student_whose_graph_is_not_fused_is_refused_at_load_naming_it(student, key, value):
    bundle = {"export.bundles.extra.source": student, f"export.bundles.extra.{key}": value}
    with pytest.raises(RecipeError, match=rf"export\.bundles\.extra\.{key} would not apply: .* a {student} student"):
        load_recipe(SMOKE, bundle)


def test_a_fusion_choice_set_to_its_default_for_a_student_is_refused_at_load_too():
    bundle = {"export.bundles.extra.source": "cnn", "export.bundles.extra.attention": "Attention"}
    with pytest.raises(RecipeError, match=r"export\.bundles\.extra\.attention would not apply"):
        load_recipe(SMOKE, bundle)


def test_tensorrt_int8_with_fewer_calibration_sentences_than_its_opt_batch_is_refused_at_load():
    engine = {"export.calibration_sentences": 4, "export.bundles.bilstm-engine.precision": "int8"}
    with pytest.raises(
        RecipeError, match=r"export\.calibration_sentences=4: the TensorRT INT8 bundles \['bilstm-engine'\]"
    ):
        load_recipe(SMOKE, engine)


@pytest.mark.parametrize(
    ("names", "value", "shown"),
    [(["no", "yes"], False, "no"), (["Yes", "No"], False, "No"), (["off", "on"], True, "on")],
)
def test_a_positive_label_yaml_reads_as_a_boolean_is_shown_quoted_as_the_label_name_it_reads_so(names, value, shown):
    with pytest.raises(ValueError, match=f'quote it, e.g. positive_label: "{shown}"'):
        DataConfig(train="unused", dev="unused", label_names=names, positive_label=value)


@pytest.mark.parametrize("field", ["text_column", "text_pair_column", "label_column", "positive_label"])
def test_a_column_or_positive_label_yaml_reads_as_a_boolean_gets_a_quoting_hint(field):
    with pytest.raises(ValueError, match=rf"data\.{field}: True is not a name: .* quote it"):
        binary(**{field: True})


@pytest.mark.parametrize(
    ("override", "quoted"),
    [
        ("--data.positive_label=yes", """--data.positive_label='"yes"' on the command line"""),
        ("--data.label_names=[no,yes]", """--data.label_names='["no", "yes"]' on the command line"""),
    ],
)
def test_a_name_an_override_gives_unquoted_is_refused_saying_how_to_quote_it_on_the_command_line(
    tmp_path, override, quoted
):
    with pytest.raises(RecipeError, match=re.escape(quoted)):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides([override]))


@pytest.mark.parametrize(
    ("override", "quoted"),
    [
        ("--name=2024-01-01", "--name='\"2024-01-01\"'"),
        ("--name=0.9", "--name='\"0.9\"'"),
        ("--distill.deploy=on", "--distill.deploy='\"on\"'"),
    ],
)
def test_text_yaml_reads_as_another_type_is_refused_saying_how_to_quote_it(override, quoted):
    with pytest.raises(RecipeError, match=re.escape(quoted)):
        load_recipe(SMOKE, parse_overrides([override]))


def test_a_dollar_before_a_variable_is_refused_as_kept_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("MYTASK", "sst2")
    with pytest.raises(RecipeError, match=r"data\.text_column: \$MYTASK would be kept as written"):
        load_recipe(write(tmp_path, MINIMAL.replace("label_names", 'text_column: "$${MYTASK}", label_names')))


def test_a_positive_label_yaml_reads_as_a_number_is_shown_quoted(tmp_path):
    with pytest.raises(RecipeError, match=r'data\.positive_label: 5 is not a name: .*positive_label: "5"'):
        load_recipe(write(tmp_path, TREC_DATA % ", positive_label: 5"))


def inherited_positive_label(tmp_path) -> str:
    """The error of a recipe that relabels MRPC, keeping the positive_label mrpc.yaml names."""
    text = f"extends: {ROOT / 'recipes' / 'mrpc.yaml'}\ndata: {{label_names: [different, same]}}\n"
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, text))
    return str(err.value)


def test_an_inherited_positive_label_that_is_no_label_name_is_named_with_the_recipe_it_comes_from(tmp_path):
    assert re.search(
        r"data\.positive_label comes from \S+mrpc\.yaml, which this recipe extends", inherited_positive_label(tmp_path)
    )


def test_a_positive_label_that_is_no_label_name_can_be_set_to_null(tmp_path):
    assert "or to null for the default" in inherited_positive_label(tmp_path)


def test_a_positive_label_the_recipe_writes_itself_is_not_said_to_be_inherited(tmp_path):
    text = f"extends: {ROOT / 'recipes' / 'mrpc.yaml'}\ndata: {{label_names: [different, same], positive_label: one}}\n"
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, text))
    assert "comes from" not in str(err.value)


@pytest.mark.parametrize(
    "override, number",
    [
        ("--bench.models.batch_sizes=[1,010]", "010"),
        ("--finetune.optim={seed: 010}", "010"),
        ("--a.x={a: [1:30]}", "1:30"),
    ],
)
def test_an_override_holding_a_number_yaml_reads_in_another_base_is_refused(override, number):
    with pytest.raises(RecipeError, match=rf"YAML 1\.1 reads {number} as an? (octal|base-60) number"):
        parse_overrides([override])


def test_a_recipe_holding_a_number_yaml_reads_as_octal_is_refused_naming_its_line(tmp_path):
    with pytest.raises(RecipeError, match=r"(?s)YAML 1\.1 reads 010 as an octal number, 8.*line 3"):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {seed: 010}}\n"))


def test_a_whole_number_yaml_reads_as_text_for_its_exponent_is_refused_written_out():
    with pytest.raises(RecipeError, match=r"max_steps: YAML 1\.1 reads 1e3 as text, not a number .*write it out, 1000"):
        load_recipe(SMOKE, parse_overrides(["--finetune.optim.max_steps=1e3"]))


def test_a_number_with_a_fraction_yaml_reads_as_text_is_not_said_to_be_whole():
    with pytest.raises(RecipeError, match=r"max_steps: Input should be a valid integer"):
        load_recipe(SMOKE, parse_overrides(["--finetune.optim.max_steps=1.5e0"]))


def test_a_quoted_number_in_another_base_is_text():
    assert parse_overrides(["--a.x=['010']"]) == {"a.x": ["010"]}


def test_an_override_value_yaml_would_cut_at_a_comment_is_refused():
    with pytest.raises(RecipeError, match=r"override --data\.train: YAML reads '#1/train\.tsv' as a comment"):
        parse_overrides(["--data.train=/tmp/my #1/train.tsv"])


def test_a_hash_inside_a_word_stays_in_the_value():
    assert parse_overrides(["--name=run#2"]) == {"name": "run#2"}


def test_a_null_override_under_a_section_the_recipe_lacks_drops_nothing(tmp_path):
    with pytest.raises(RecipeError, match=r"override --export\.cascades=null drops nothing: the recipe has no export"):
        load_recipe(write(tmp_path, MINIMAL), parse_overrides(["--export.cascades=null"]))


def test_a_null_override_of_a_mapping_the_recipes_section_lacks_drops_nothing():
    with pytest.raises(
        RecipeError, match=r"override --export\.cascades=null drops nothing: the recipe has no export\.cascades$"
    ):
        load_recipe("recipes/trec.yaml", parse_overrides(["--export.cascades=null"]))


def test_a_null_override_under_a_section_every_recipe_has_sets_the_setting_over_its_default():
    recipe = load_recipe(SMOKE, parse_overrides(["--loadtest.soak.slo.min_rate_share=null"]))
    assert recipe.loadtest.soak.slo.min_rate_share is None


def test_a_null_override_under_a_section_every_recipe_has_keeps_the_section_s_other_defaults():
    recipe = load_recipe(SMOKE, parse_overrides(["--loadtest.soak.slo.min_rate_share=null"]))
    assert recipe.loadtest.soak.slo.max_error_rate == load_recipe(SMOKE).loadtest.soak.slo.max_error_rate


def test_a_null_override_of_a_setting_in_a_section_the_recipe_lacks_sets_it():
    recipe = load_recipe(ROOT / "recipes" / "trec.yaml", parse_overrides(["--loadtest.smoke.slo.min_rate_share=null"]))
    assert recipe.loadtest.smoke.slo.min_rate_share is None


def test_a_null_override_under_a_named_section_the_recipe_lacks_drops_nothing():
    with pytest.raises(RecipeError, match=r"override --export\.bundles\.nope\.fold=null drops nothing"):
        load_recipe(SMOKE, parse_overrides(["--export.bundles.nope.fold=null"]))


def test_the_device_variable_stays_beside_a_mapping_override_of_its_section(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cpu")
    assert load_recipe(SMOKE, parse_overrides(["--runtime={precision: fp32}"])).runtime.device == "cpu"


def test_a_mapping_override_that_sets_the_device_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cpu")
    assert load_recipe(SMOKE, parse_overrides(["--runtime={device: auto}"])).runtime.device == "auto"


def test_a_device_variable_the_recipe_cannot_take_is_named_with_the_file_not_as_an_override(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cpu")
    recipe = write(tmp_path, MINIMAL + "runtime: cpu\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert str(err.value) == (
        f"{recipe}: EDGEDISTILL_DEVICE=cpu, which sets runtime.device: runtime is a setting, not a section"
    )


def test_an_extends_override_is_refused_saying_the_recipe_file_names_it():
    with pytest.raises(RecipeError, match=r"override --extends: a recipe file names the recipe it extends"):
        load_recipe(SMOKE, parse_overrides(["--extends=sst2"]))


def test_a_key_a_recipe_replaced_away_is_not_said_to_come_from_its_base(tmp_path):
    base = write(tmp_path, MINIMAL + "distill: {deploy: a, students: {a: {model: {arch: cnn}}}}\n", "base.yaml")
    child = "extends: base.yaml\ndistill: !replace {students: {b: {model: {arch: cnn}}}}\n"
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, child))
    assert str(base) not in str(err.value)


def test_a_section_key_yaml_read_as_a_boolean_is_named_as_written_by_its_section(tmp_path):
    with pytest.raises(RecipeError, match=r"finetune\.optim: a key read as a boolean, True: .*quote it"):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {yes: 1}}\n"))


@pytest.mark.parametrize(
    "override, key",
    [
        ("--bench.models.batch_sizes=[1,0]", r"bench\.models\.batch_sizes\.1"),
        ("--bench.models.seq_lens=[-1]", r"bench\.models\.seq_lens\.0"),
        ("--bench.scaling.workers=[1,-1]", r"bench\.scaling\.workers\.1"),
        ("--distill.students.cnn.model.kernel_sizes=[0]", r"distill\.students\.cnn\.model\.kernel_sizes\.0"),
    ],
)
def test_a_list_item_out_of_range_is_refused_naming_it(override, key):
    with pytest.raises(RecipeError, match=rf"{key}: Input should be greater than"):
        load_recipe(SMOKE, parse_overrides([override]))


def test_a_runs_folder_a_file_stands_in_the_way_of_is_a_setting_error(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "file" / "runs"))
    with pytest.raises(SettingError, match=r"EDGEDISTILL_RUNS_DIR .*file is a file, not a folder"):
        run_dir(load_recipe("smoke"))


def test_a_runs_folder_a_file_stands_in_the_way_of_under_the_old_name_names_the_old_name(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.delenv("EDGEDISTILL_RUNS_DIR", raising=False)
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "file" / "runs"))
    with pytest.raises(SettingError, match=r"^RUNS_DIR .*file is a file, not a folder"):
        run_dir(load_recipe("smoke"))


def test_a_deployed_bundle_not_among_the_bundles_is_answered_with_the_nearest():
    with pytest.raises(RecipeError, match=r"export\.deploy=bilstm-int9 is not one of .*: did you mean bilstm-int8\? "):
        load_recipe("smoke", {"export.deploy": "bilstm-int9"})
