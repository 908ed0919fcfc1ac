"""Pipeline settings: `EDGEDISTILL_*` names, the old names still read with a warning, defaults from the working
directory, the server leaving the pipeline's variables alone, and the pipeline refusing names nothing reads."""

import re
import warnings
from pathlib import Path

import pytest
from edgedistill.common import machine, settings
from edgedistill.common.recipe import load_recipe, run_dir
from edgedistill.serve.settings import Settings, SettingsError, env_name, load_settings

ROOT = Path(__file__).resolve().parents[2]

RECIPE = """\
name: elsewhere
data: {train: "${EDGEDISTILL_DATA_DIR}/train.tsv", dev: "${DATA_DIR}/dev.tsv", label_names: [neg, pos]}
model: {init: "${EDGEDISTILL_TEACHER_INIT}"}
"""


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No path or thread setting from the outer environment, and each old name warns again."""
    for new, old in settings.RENAMED.items():
        monkeypatch.delenv(new, raising=False)
        monkeypatch.delenv(old, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    settings.warn_renamed.cache_clear()


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory outside the checkout, with `../shared/data` beside it and a recipe in `recipes/`."""
    cwd = tmp_path / "project"
    (cwd / "recipes").mkdir(parents=True)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (cwd / "recipes" / "base.yaml").write_text(RECIPE, encoding="utf-8")
    (cwd / "recipes" / "child.yaml").write_text("extends: base\n", encoding="utf-8")
    monkeypatch.chdir(cwd)
    return cwd


def test_runs_default_to_runs_in_the_working_directory(elsewhere):
    assert settings.defaults()["EDGEDISTILL_RUNS_DIR"] == str(elsewhere / "runs")


def test_data_defaults_to_shared_data_beside_the_working_directory(elsewhere):
    assert settings.defaults()["EDGEDISTILL_DATA_DIR"] == str(elsewhere.parent / "shared" / "data")


def test_data_defaults_to_data_in_the_working_directory_without_shared(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert settings.defaults()["EDGEDISTILL_DATA_DIR"] == str(tmp_path / "data")


def test_teacher_defaults_to_the_hub_model_without_a_shared_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert settings.defaults()["EDGEDISTILL_TEACHER_INIT"] == settings.HUB_TEACHER


def test_a_recipe_extends_a_recipe_by_name_from_recipes_in_the_working_directory(elsewhere):
    recipe = load_recipe("recipes/child.yaml")
    assert recipe.data.train == str(elsewhere.parent / "shared" / "data" / "train.tsv")


def test_a_recipe_reads_the_old_spelling_of_a_setting(elsewhere):
    recipe = load_recipe("recipes/base.yaml")
    assert recipe.data.dev == str(elsewhere.parent / "shared" / "data" / "dev.tsv")


def test_the_run_folder_is_under_the_working_directory(elsewhere):
    assert run_dir(load_recipe("recipes/base.yaml")) == elsewhere / "runs" / "elsewhere"


@pytest.mark.parametrize(("new", "old"), list(settings.RENAMED.items()))
def test_an_old_name_still_works(monkeypatch, new, old):
    monkeypatch.setenv(old, "7")
    with pytest.warns(FutureWarning):
        assert settings.env(new) == "7"


@pytest.mark.parametrize(("new", "old"), list(settings.RENAMED.items()))
def test_an_old_name_warns_naming_the_new_one(monkeypatch, new, old):
    monkeypatch.setenv(old, "7")
    with pytest.warns(FutureWarning, match=f"{old} is deprecated.*set {new} instead"):
        settings.env(new)


def test_an_old_name_warns_once(monkeypatch):
    monkeypatch.setenv("RUNS_DIR", "/old")
    with pytest.warns(FutureWarning):
        settings.defaults()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings.defaults()


def test_the_new_name_wins_over_the_old(monkeypatch):
    monkeypatch.setenv("RUNS_DIR", "/old")
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", "/new")
    assert settings.defaults()["EDGEDISTILL_RUNS_DIR"] == "/new"


def test_a_recipe_sees_the_new_value_under_the_old_name(monkeypatch):
    monkeypatch.setenv("DATA_DIR", "/old")
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "/new")
    assert settings.variables()["DATA_DIR"] == "/new"


def test_threads_follow_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert settings.threads() == 3


def test_the_threads_setting_wins_over_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("EDGEDISTILL_TORCH_THREADS", "5")
    assert settings.threads() == 5


def test_threads_default_to_every_usable_core(monkeypatch):
    monkeypatch.setattr(machine, "cpu_quota", lambda *cgroup: None)
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda pid: set(range(6)))
    assert settings.threads() == 6


def test_threads_default_to_the_cpus_of_a_cgroup_quota_not_the_machines(monkeypatch):
    monkeypatch.setattr(settings.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(machine, "cpu_quota", lambda *cgroup: 2)
    assert settings.threads() == 2


def test_a_bad_thread_count_names_the_variable(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_TORCH_THREADS", "many")
    with pytest.raises(ValueError, match="EDGEDISTILL_TORCH_THREADS='many'"):
        settings.threads()


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_bad_thread_count_under_the_old_name_names_the_old_name(monkeypatch):
    monkeypatch.setenv("TORCH_THREADS", "many")
    with pytest.raises(ValueError, match="^TORCH_THREADS='many'"):
        settings.threads()


@pytest.mark.parametrize(("new", "old"), list(settings.RENAMED.items()))
def test_the_variable_read_is_the_old_name_where_only_it_is_set(monkeypatch, new, old):
    monkeypatch.delenv(new, raising=False)
    monkeypatch.setenv(old, "7")
    assert settings.env_name(new) == old


@pytest.mark.parametrize(("new", "old"), list(settings.RENAMED.items()))
def test_the_variable_read_is_the_new_name_where_both_are_set(monkeypatch, new, old):
    monkeypatch.setenv(new, "7")
    monkeypatch.setenv(old, "8")
    assert settings.env_name(new) == new


@pytest.mark.parametrize("name", sorted(settings.PIPELINE))
def test_the_server_accepts_the_pipeline_variables(name):
    assert load_settings([], environ={name: "1"}).port == 50051


def test_the_server_still_refuses_an_unknown_variable():
    with pytest.raises(SettingsError, match="EDGEDISTILL_NO_SUCH"):
        load_settings([], environ={"EDGEDISTILL_NO_SUCH": "1"})


def test_a_runs_folder_under_home_is_in_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", "~/runs")
    assert run_dir(load_recipe(write_recipe(tmp_path))) == tmp_path / "home" / "runs" / "elsewhere"


def test_a_tensorrt_cache_under_home_is_in_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("EDGEDISTILL_TRT_CACHE", "~/trt")
    assert settings.trt_cache() == tmp_path / "trt"


def write_recipe(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(RECIPE)
    return path


@pytest.mark.parametrize(
    ("name", "meant"), [("EDGEDISTILL_RUN_DIR", "EDGEDISTILL_RUNS_DIR"), ("EDGEDISTILL_DEVICES", "EDGEDISTILL_DEVICE")]
)
def test_a_misspelt_setting_is_refused_at_load_naming_the_one_meant(tmp_path, monkeypatch, name, meant):
    monkeypatch.setenv(name, "x")
    with pytest.raises(settings.SettingError, match=rf"{name} \(did you mean {meant}\?\): no edgedistill setting"):
        load_recipe(write_recipe(tmp_path))


# What the kubelet sets in a pod for the Service `edgedistill-serve` (cluster IP 10.0.0.5, or fd00::5 in an IPv6
# cluster; port `grpc` 50051/TCP), or for a Service `edgedistill`, one variable of each shape
SERVICE_LINKS = [
    ("EDGEDISTILL_SERVE_SERVICE_HOST", "10.0.0.5"),
    ("EDGEDISTILL_SERVE_SERVICE_HOST", "fd00::5"),
    ("EDGEDISTILL_SERVE_SERVICE_PORT", "50051"),
    ("EDGEDISTILL_SERVE_SERVICE_PORT_GRPC", "50051"),
    ("EDGEDISTILL_SERVE_PORT", "tcp://10.0.0.5:50051"),
    ("EDGEDISTILL_SERVE_PORT", "tcp://[fd00::5]:50051"),
    ("EDGEDISTILL_SERVE_PORT", "tcp://fd00::5:50051"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP", "tcp://10.0.0.5:50051"),
    ("EDGEDISTILL_SERVE_PORT_50051_UDP", "udp://10.0.0.5:50051"),
    ("EDGEDISTILL_SERVE_PORT_50051_SCTP", "sctp://10.0.0.5:50051"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP_PROTO", "tcp"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP_PORT", "50051"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP_ADDR", "10.0.0.5"),
    ("EDGEDISTILL_SERVICE_HOST", "10.0.0.5"),
    ("EDGEDISTILL_PORT_50051_TCP", "tcp://10.0.0.5:50051"),
]
# A service link's name with a value the kubelet never gives it
NOT_SERVICE_LINKS = [
    ("EDGEDISTILL_SERVE_SERVICE_HOST", "runs"),
    ("EDGEDISTILL_SERVE_SERVICE_PORT", "grpc"),
    ("EDGEDISTILL_SERVE_PORT", "50051"),
    ("EDGEDISTILL_SERVE_PORT", "http://10.0.0.5:50051"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP", "tcp://10.0.0.5:50052"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP", "udp://10.0.0.5:50051"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP_PROTO", "udp"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP_PORT", "50052"),
    ("EDGEDISTILL_SERVE_PORT_50051_TCP_ADDR", "edgedistill-serve"),
]


@pytest.mark.parametrize(("name", "value"), SERVICE_LINKS)
def test_a_kubernetes_service_link_is_left_alone_at_load(tmp_path, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert load_recipe(write_recipe(tmp_path)).name == "elsewhere"


@pytest.mark.parametrize(("name", "value"), NOT_SERVICE_LINKS)
def test_a_name_under_the_prefix_without_a_service_links_value_is_still_refused(tmp_path, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(settings.SettingError, match=f"{name}.*: no edgedistill setting"):
        load_recipe(write_recipe(tmp_path))


@pytest.mark.parametrize(
    ("name", "value", "service"),
    [
        ("EDGEDISTILL_SERVE_PORT_50051_TCP_ADDR", "10.0.0.5", "edgedistill-serve"),
        ("EDGEDISTILL_PORT", "tcp://10.0.0.5:50051", "edgedistill"),
        ("EDGEDISTILL_HEALTH_PORT", "tcp://10.0.0.5:50052", "edgedistill-health"),
    ],
)
def test_a_service_link_names_its_service(name, value, service):
    assert settings.service_link(name, value) == service


def test_a_server_setting_in_the_pipelines_environment_is_left_to_the_server(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_WORKERS", "2")
    assert load_recipe(write_recipe(tmp_path)).name == "elsewhere"


def test_the_server_settings_common_names_are_the_servers_own():
    assert {env_name(field) for field in Settings.model_fields} == settings.SERVER


# Names the repository writes as examples of names nothing reads: misspellings the tests feed the checks, a user's own
# variable under the prefix, the variables Kubernetes' service links would inject
UNKNOWN_ON_PURPOSE = {
    "EDGEDISTILL_DEVICES",
    "EDGEDISTILL_MY_DATA",
    "EDGEDISTILL_NO_SUCH",
    "EDGEDISTILL_PROT",
    "EDGEDISTILL_PRT",
    "EDGEDISTILL_RUN_DIR",
    "EDGEDISTILL_TORCH_THREAD",
    "EDGEDISTILL_PORT_50051_TCP",
    "EDGEDISTILL_SERVE_PORT",
    "EDGEDISTILL_SERVE_PORT_50051_SCTP",
    "EDGEDISTILL_SERVE_PORT_50051_TCP",
    "EDGEDISTILL_SERVE_PORT_50051_TCP_ADDR",
    "EDGEDISTILL_SERVE_PORT_50051_TCP_PORT",
    "EDGEDISTILL_SERVE_PORT_50051_TCP_PROTO",
    "EDGEDISTILL_SERVE_PORT_50051_UDP",
    "EDGEDISTILL_SERVE_SERVICE_HOST",
    "EDGEDISTILL_SERVE_SERVICE_PORT",
    "EDGEDISTILL_SERVE_SERVICE_PORT_GRPC",
    "EDGEDISTILL_SERVICE_HOST",
}
NAME = re.compile(r"\bEDGEDISTILL_[A-Z0-9_]+\b(?!\*)")  # not a family of names: `EDGEDISTILL_TLS_*`
OWN_FILES = ("*.py", "*.sh", "*.md", "*.yml", "*.yaml", "*.toml", "Makefile", "Dockerfile*")


def test_every_edgedistill_name_the_repository_writes_is_a_setting_the_pipeline_or_the_server_reads():
    tops = [
        top
        for top in ROOT.iterdir()
        if top.is_dir() and (top.name == ".ci" or not top.name.startswith(".")) and top.name != "runs"
    ]
    files = {file for pattern in OWN_FILES for file in ROOT.glob(pattern)}
    files |= {file for top in tops for pattern in OWN_FILES for file in top.rglob(pattern)}
    written = {name for file in files if file.is_file() for name in NAME.findall(file.read_text(encoding="utf-8"))}
    assert written - (settings.PIPELINE | settings.SERVER) == UNKNOWN_ON_PURPOSE
