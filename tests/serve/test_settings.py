"""Settings from flags and EDGEDISTILL_* variables."""

import re
from pathlib import Path

import pytest
from edgedistill.common.settings import SettingError
from edgedistill.serve import settings as settings_module
from edgedistill.serve.app import connection_options
from edgedistill.serve.settings import (
    GRPC_INT_MAX,
    NEVER_S,
    Settings,
    SettingsError,
    build_parser,
    env_name,
    load_settings,
    loopback_host,
    on_loopback,
    refuse_unused,
)

from tests.common.test_settings import NOT_SERVICE_LINKS, SERVICE_LINKS


def test_without_flags_or_environment_the_settings_take_their_defaults():
    settings = load_settings([], environ={})
    assert settings.port == 50051
    assert settings.metrics_port == 8002
    assert settings.max_batch_size == 32
    assert settings.max_queue_delay == 0.0
    assert settings.providers == []
    assert settings.bundle is None
    assert settings.token is None


def test_settings_come_from_the_environment_and_a_flag_overrides_it():
    environ = {
        "EDGEDISTILL_PORT": "6000",
        "EDGEDISTILL_BUNDLE": "runs/sst2/bundle-bilstm-int8",
        "EDGEDISTILL_MAX_BATCH_SIZE": "16",
        "EDGEDISTILL_MAX_QUEUE_DELAY_MS": "2.5",
        "EDGEDISTILL_MAX_QUEUED": "100",
        "EDGEDISTILL_THREADS": "2",
        "EDGEDISTILL_PROVIDERS": "cuda, CPUExecutionProvider",
        "EDGEDISTILL_METRICS_PORT": "off",
        "EDGEDISTILL_TOKEN": "s3cret",
        "EDGEDISTILL_LOG_LEVEL": "debug",
        "HOME": "/root",
    }
    settings = load_settings(["--port", "7000", "--max-texts", "10"], environ=environ)
    assert settings.port == 7000  # the flag wins
    assert settings.bundle == Path("runs/sst2/bundle-bilstm-int8")
    assert settings.max_batch_size == 16
    assert settings.max_queue_delay == pytest.approx(0.0025)
    assert settings.max_queued == 100
    assert settings.max_texts == 10
    assert settings.threads == 2
    assert settings.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert settings.metrics_port is None
    assert settings.token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert settings.log_level == "DEBUG"


def test_a_provider_onnx_runtime_has_in_no_build_is_refused_naming_the_variable_and_the_nearest():
    with pytest.raises(
        SettingsError,
        match=r"--providers / EDGEDISTILL_PROVIDERS: .*'CPUExecutionProvder' is no ONNX Runtime execution provider, "
        r"in any build: did you mean CPUExecutionProvider\? ",
    ):
        load_settings([], environ={"EDGEDISTILL_PROVIDERS": "cuda, CPUExecutionProvder"})


def test_a_provider_after_the_cpus_is_refused_naming_the_variable():
    with pytest.raises(
        SettingsError,
        match=r"--providers / EDGEDISTILL_PROVIDERS: .*CUDAExecutionProvider after CPUExecutionProvider would run "
        r"nothing",
    ):
        load_settings([], environ={"EDGEDISTILL_PROVIDERS": "cpu,cuda"})


def test_a_misspelt_variable_is_answered_with_the_nearest_one():
    with pytest.raises(
        SettingsError, match="unknown environment variable EDGEDISTILL_PRT; did you mean EDGEDISTILL_PORT"
    ):
        load_settings([], environ={"EDGEDISTILL_PRT": "1"})


@pytest.mark.parametrize(
    ("name", "nearest"),
    [("EDGEDISTILL_RUN_DIR", "EDGEDISTILL_RUNS_DIR"), ("EDGEDISTILL_TORCH_THREAD", "EDGEDISTILL_TORCH_THREADS")],
)
def test_a_misspelt_pipeline_variable_is_answered_with_the_pipelines_name(name, nearest):
    with pytest.raises(SettingsError, match=f"unknown environment variable {name}; did you mean {nearest}\\?"):
        load_settings([], environ={name: "1"})


def test_unknown_variable_is_refused_with_the_known_ones():
    with pytest.raises(SettingsError, match="EDGEDISTILL_PROT.*EDGEDISTILL_PORT"):
        load_settings([], environ={"EDGEDISTILL_PROT": "1"})


@pytest.mark.parametrize(("name", "value"), SERVICE_LINKS)
def test_a_kubernetes_service_link_is_ignored(name, value):
    assert load_settings([], environ={name: value}) == load_settings([], environ={})


@pytest.mark.parametrize(("name", "value"), NOT_SERVICE_LINKS)
def test_a_name_under_the_prefix_without_a_service_links_value_is_still_refused(name, value):
    with pytest.raises(SettingsError, match=f"unknown environment variable {name};"):
        load_settings([], environ={name: value})


# A Service named after a setting, whose first port's service link is that setting's variable
LINKED_SETTINGS = [
    ("EDGEDISTILL_PORT", "tcp://10.0.0.5:50051", "edgedistill"),
    ("EDGEDISTILL_HEALTH_PORT", "tcp://10.0.0.5:50052", "edgedistill-health"),
    ("EDGEDISTILL_METRICS_PORT", "tcp://[fd00::5]:8002", "edgedistill-metrics"),
]


@pytest.mark.parametrize(("name", "value", "service"), LINKED_SETTINGS)
def test_a_service_link_that_sets_a_setting_is_refused_naming_its_service(name, value, service):
    message = rf"{re.escape(name)}={re.escape(value)} looks like a Kubernetes service link.* Service {service} "
    with pytest.raises(SettingsError, match=message):
        load_settings([], environ={name: value})


def test_a_service_link_that_sets_a_setting_is_refused_naming_the_pods_setting():
    with pytest.raises(SettingsError, match="set `enableServiceLinks: false` in the pod's spec"):
        load_settings([], environ={"EDGEDISTILL_PORT": "tcp://10.0.0.5:50051"})


def test_a_service_link_that_sets_a_setting_is_refused_saying_the_containers_variable_wins():
    with pytest.raises(SettingsError, match="set EDGEDISTILL_PORT in the container's `env`"):
        load_settings([], environ={"EDGEDISTILL_PORT": "tcp://10.0.0.5:50051"})


def test_a_flag_overrides_a_service_link_that_sets_its_setting():
    assert load_settings(["--port", "6000"], environ={"EDGEDISTILL_PORT": "tcp://10.0.0.5:50051"}).port == 6000


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"EDGEDISTILL_PORT": "http"}, "--port / EDGEDISTILL_PORT"),
        ({"EDGEDISTILL_MAX_BATCH_SIZE": "0"}, "--max-batch-size / EDGEDISTILL_MAX_BATCH_SIZE"),
        (
            {"EDGEDISTILL_TLS_CERT": "a.pem"},
            r"EDGEDISTILL_TLS_CERT \(--tls-cert\) and EDGEDISTILL_TLS_KEY \(--tls-key\) go",
        ),
        (
            {"EDGEDISTILL_TLS_CA": "ca.pem"},
            r"EDGEDISTILL_TLS_CA \(--tls-ca\) \(mutual TLS\) needs EDGEDISTILL_TLS_CERT",
        ),
        ({"EDGEDISTILL_MAX_TEXTS": "50", "EDGEDISTILL_MAX_QUEUED": "10"}, "must not exceed EDGEDISTILL_MAX_QUEUED"),
        (
            {"EDGEDISTILL_PORT": "8002"},
            r"EDGEDISTILL_METRICS_PORT \(--metrics-port\) 8002 must differ from EDGEDISTILL_PORT",
        ),
    ],
)
def test_invalid_values_name_the_flag_and_variable(environ, message):
    with pytest.raises(SettingsError, match=message):
        load_settings([], environ=environ)


def test_every_field_has_a_flag_with_its_variable_in_the_help():
    help_text = build_parser().format_help()
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in help_text
        assert "EDGEDISTILL_" + name.upper() in help_text


def test_the_metrics_port_binds_to_loopback_by_default():
    assert load_settings([], {}).metrics_host == "127.0.0.1"


def test_reload_paths_are_off_by_default():
    settings = load_settings([], {"EDGEDISTILL_BUNDLE": "runs/sst2/bundle"})
    assert settings.reload_root is None
    assert settings.admin_token is None


@pytest.mark.parametrize("root", ["/", "/tmp/../"])
def test_a_file_system_root_is_refused_as_the_reload_root(root):
    with pytest.raises(SettingsError, match="is a file system root"):
        load_settings([], {"EDGEDISTILL_RELOAD_ROOT": root})


def test_a_reload_root_that_does_not_exist_is_refused_naming_it(tmp_path):
    root = tmp_path / "bundles"
    with pytest.raises(SettingsError, match=rf"EDGEDISTILL_RELOAD_ROOT \(--reload-root\) {root} does not exist"):
        load_settings([], {"EDGEDISTILL_RELOAD_ROOT": str(root), "EDGEDISTILL_ADMIN_TOKEN": "a"})


def test_a_reload_root_that_is_a_file_is_refused_naming_it(tmp_path):
    (root := tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(SettingsError, match=rf"RELOAD_ROOT \(--reload-root\) {root} is a file, not a folder"):
        load_settings([], {"EDGEDISTILL_RELOAD_ROOT": str(root), "EDGEDISTILL_ADMIN_TOKEN": "a"})


def test_a_reload_root_that_is_a_folder_is_accepted(tmp_path):
    settings = load_settings([], {"EDGEDISTILL_RELOAD_ROOT": str(tmp_path), "EDGEDISTILL_ADMIN_TOKEN": "a"})
    assert settings.reload_root == tmp_path


def test_a_reload_root_without_an_admin_token_is_refused_naming_both(tmp_path):
    with pytest.raises(
        SettingsError, match=r"RELOAD_ROOT \(--reload-root\) lets Reload calls name a bundle, and Reload "
    ):
        load_settings([], {"EDGEDISTILL_RELOAD_ROOT": str(tmp_path)})


def test_the_admin_token_must_differ_from_the_classify_token():
    with pytest.raises(
        SettingsError, match=r"EDGEDISTILL_ADMIN_TOKEN \(--admin-token\) must differ from EDGEDISTILL_TOKEN"
    ):
        load_settings([], {"EDGEDISTILL_TOKEN": "same", "EDGEDISTILL_ADMIN_TOKEN": "same"})


@pytest.mark.parametrize("variable", ["EDGEDISTILL_TOKEN", "EDGEDISTILL_ADMIN_TOKEN"])
@pytest.mark.parametrize("token", ["s3cret\n", "s3cret\tpart", "s3cr\u00e9t"])
def test_a_token_no_client_can_send_is_refused_without_showing_it(variable, token):
    with pytest.raises(SettingsError, match=f"{variable}: .*printable ASCII") as refused:
        load_settings([], {variable: token})
    assert "s3cr" not in str(refused.value)


BLANKS = ["", "\n", " ", "none", "None", "off", "OFF"]


@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize(
    ("variable", "remedy"),
    [("EDGEDISTILL_TOKEN", "to serve without a token"), ("EDGEDISTILL_ADMIN_TOKEN", "to refuse Reload calls")],
)
def test_an_empty_token_is_refused_saying_to_unset_it(variable, remedy, blank):
    with pytest.raises(SettingsError, match=f"{variable}: .*unset the variable .*{remedy}"):
        load_settings([], {variable: blank})


@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize(
    ("variable", "remedy"),
    [
        ("EDGEDISTILL_TLS_CERT", "to serve plaintext"),
        ("EDGEDISTILL_TLS_KEY", "to serve plaintext"),
        ("EDGEDISTILL_TLS_CA", "to ask clients for no certificate"),
    ],
)
def test_an_empty_tls_path_is_refused_saying_to_unset_it(variable, remedy, blank):
    with pytest.raises(SettingsError, match=f"{variable}: .*unset the variable .*{remedy}"):
        load_settings([], {variable: blank})


@pytest.mark.parametrize("empty", ["", " ", "\n"])
@pytest.mark.parametrize(
    ("variable", "remedy"),
    [
        ("EDGEDISTILL_METRICS_PORT", "'off' turns the port off"),
        ("EDGEDISTILL_HEALTH_PORT", "'off' turns the port off"),
        ("EDGEDISTILL_BUNDLE", "name the folder, or unset the variable"),
        ("EDGEDISTILL_RELOAD_ROOT", "name the folder, or unset the variable"),
    ],
)
def test_an_empty_port_or_folder_is_refused_where_it_would_turn_it_off_unnoticed(variable, remedy, empty):
    with pytest.raises(SettingsError, match=f"{variable}: must not be empty: {remedy}"):
        load_settings([], {variable: empty})


@pytest.mark.parametrize("empty", ["", " ", "\n"])
@pytest.mark.parametrize(
    ("variable", "default"), [("EDGEDISTILL_HOST", "[::]"), ("EDGEDISTILL_METRICS_HOST", "127.0.0.1")]
)
def test_an_empty_address_is_refused_naming_the_default(variable, default, empty):
    refusal = rf"{variable}: must not be empty: name an address .* for the default, {re.escape(default)}"
    with pytest.raises(SettingsError, match=refusal):
        load_settings([], {variable: empty})


@pytest.mark.parametrize("variable", ["EDGEDISTILL_METRICS_PORT", "EDGEDISTILL_HEALTH_PORT"])
def test_off_turns_a_port_off(variable):
    assert getattr(load_settings([], {variable: "off"}), variable.removeprefix("EDGEDISTILL_").lower()) is None


@pytest.mark.parametrize("field", ["bundle", "tls_cert", "tls_key", "tls_ca", "reload_root"])
def test_a_path_from_the_home_folder_is_made_absolute(field, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "x").mkdir()  # a reload root must be a folder
    environ = {"EDGEDISTILL_TLS_CERT": "c.pem", "EDGEDISTILL_TLS_KEY": "k.pem", "EDGEDISTILL_ADMIN_TOKEN": "a"}
    settings = load_settings([], environ | {f"EDGEDISTILL_{field.upper()}": "~/x"})
    assert getattr(settings, field) == tmp_path / "x"


def test_unset_tokens_mean_no_token():
    settings = load_settings([], {})
    assert (settings.token, settings.admin_token) == (None, None)


def test_unset_tls_paths_mean_plaintext():
    settings = load_settings([], {})
    assert (settings.tls_cert, settings.tls_key, settings.tls_ca) == (None, None, None)


def test_concurrency_limits_are_settable():
    settings = load_settings(["--max-concurrent-rpcs", "8", "--max-concurrent-streams", "4"], {})
    assert settings.max_concurrent_rpcs == 8
    assert settings.max_concurrent_streams == 4


def test_a_bad_server_setting_is_a_setting_error_as_a_bad_pipeline_setting_is():
    with pytest.raises(SettingError, match="EDGEDISTILL_PORT"):
        load_settings([], environ={"EDGEDISTILL_PORT": "70000"})


def test_a_metrics_host_with_the_metrics_port_off_is_refused_naming_both():
    settings = load_settings(["--metrics-port", "off"], environ={"EDGEDISTILL_METRICS_HOST": "0.0.0.0"})
    refusal = r"EDGEDISTILL_METRICS_HOST \(--metrics-host\) 0.0.0.0 would do nothing: the metrics port is off"
    with pytest.raises(SettingsError, match=refusal):
        refuse_unused(settings, 1)


@pytest.mark.parametrize("level", ["WARNING", "ERROR"])
def test_an_access_log_at_a_log_level_that_hides_it_is_refused(level):
    settings = load_settings(["--access-log", "true", "--log-level", level], environ={})
    with pytest.raises(SettingsError, match=rf"EDGEDISTILL_ACCESS_LOG \(--access-log\) would do nothing .* is {level}"):
        refuse_unused(settings, 1)


def test_an_access_log_at_info_is_accepted():
    assert refuse_unused(load_settings(["--access-log", "true"], environ={}), 1) is None


def test_a_start_timeout_for_one_process_is_refused_naming_workers():
    settings = load_settings(["--workers", "1"], environ={"EDGEDISTILL_START_TIMEOUT_S": "600"})
    refusal = r"EDGEDISTILL_START_TIMEOUT_S \(--start-timeout-s\) 600 would do nothing: EDGEDISTILL_WORKERS=1 serves"
    with pytest.raises(SettingsError, match=refusal):
        refuse_unused(settings, 1)


def test_a_start_timeout_where_workers_0_comes_to_one_process_on_one_core_is_refused_saying_why(monkeypatch):
    monkeypatch.setattr(settings_module, "usable_cores", lambda: 1)
    settings = load_settings([], environ={"EDGEDISTILL_START_TIMEOUT_S": "600"})
    refusal = r"would do nothing: EDGEDISTILL_WORKERS=0 resolved to one process on this machine \(one usable core\)"
    with pytest.raises(SettingsError, match=refusal):
        refuse_unused(settings, 1)


def test_a_start_timeout_where_workers_0_comes_to_one_process_for_its_memory_is_refused_saying_why(monkeypatch):
    monkeypatch.setattr(settings_module, "usable_cores", lambda: 8)
    monkeypatch.setattr(settings_module, "usable_memory", lambda: 300 << 20)
    settings = load_settings([], environ={"EDGEDISTILL_START_TIMEOUT_S": "600"})
    with pytest.raises(SettingsError, match=r"\(its usable memory, 300 MiB, holds one worker\)"):
        refuse_unused(settings, 1)


def test_a_start_timeout_under_a_supervisor_is_accepted():
    assert refuse_unused(load_settings(["--workers", "2", "--start-timeout-s", "600"], environ={}), 2) is None


def test_a_start_timeout_where_workers_0_comes_to_several_processes_is_accepted():
    assert refuse_unused(load_settings(["--start-timeout-s", "600"], environ={}), 2) is None


def test_a_metrics_host_with_the_metrics_port_on_is_accepted():
    settings = load_settings([], environ={"EDGEDISTILL_METRICS_HOST": "0.0.0.0"})
    assert refuse_unused(settings, 1) is None


FLOAT_FIELDS = [name for name, info in Settings.model_fields.items() if info.annotation is float]


@pytest.mark.parametrize("value", ["inf", "1e400", "nan"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_a_time_that_is_not_finite_is_refused_naming_its_variable(field, value):
    with pytest.raises(SettingsError, match=env_name(field)):
        load_settings([], {env_name(field): value})


@pytest.mark.parametrize("field", ["max_message_bytes", "max_concurrent_rpcs", "max_concurrent_streams"])
def test_a_limit_past_what_grpc_takes_is_refused_naming_its_variable(field):
    with pytest.raises(SettingsError, match=env_name(field)):
        load_settings([], {env_name(field): str(GRPC_INT_MAX + 1)})


@pytest.mark.parametrize("field", ["max_texts", "max_queued"])
def test_a_count_model_info_carries_as_an_int32_is_refused_past_one_naming_its_variable(field):
    too_many = str(GRPC_INT_MAX + 1)  # both, since MAX_TEXTS may not exceed MAX_QUEUED
    with pytest.raises(SettingsError, match=f"{env_name(field)}.*less than or equal to {GRPC_INT_MAX}"):
        load_settings([], {"EDGEDISTILL_MAX_TEXTS": too_many, "EDGEDISTILL_MAX_QUEUED": too_many})


def test_an_infinite_connection_age_is_refused_with_the_value_grpc_takes_as_never():
    with pytest.raises(SettingsError, match=f"for never, set {NEVER_S} or more"):
        load_settings([], {"EDGEDISTILL_CONNECTION_AGE_S": "inf"})


def test_the_connection_age_said_to_mean_never_is_grpcs_never():
    options = dict(connection_options(load_settings([], {"EDGEDISTILL_CONNECTION_AGE_S": str(NEVER_S)})))
    assert options["grpc.max_connection_age_ms"] == GRPC_INT_MAX


TIME_OPTIONS = {
    "handshake_timeout_s": "grpc.server_handshake_timeout_ms",
    "connection_idle_s": "grpc.max_connection_idle_ms",
    "connection_age_s": "grpc.max_connection_age_ms",
    "connection_age_grace_s": "grpc.max_connection_age_grace_ms",
    "keepalive_s": "grpc.keepalive_time_ms",
}


@pytest.mark.parametrize(("field", "option"), TIME_OPTIONS.items())
def test_a_time_too_large_for_ms_as_a_float_is_grpcs_never(field, option):
    options = dict(connection_options(load_settings([], {env_name(field): "1e306"})))
    assert options[option] == GRPC_INT_MAX


@pytest.mark.parametrize(("field", "option"), TIME_OPTIONS.items())
def test_a_time_under_a_millisecond_is_one_millisecond_not_grpcs_0(field, option):
    options = dict(connection_options(load_settings([], {env_name(field): "0.0004"})))
    assert options[option] == 1


@pytest.mark.parametrize("field", ["malloc_arenas", "threads"])
def test_a_count_the_c_libraries_take_past_a_c_int_is_refused_naming_its_variable(field):
    with pytest.raises(SettingsError, match=env_name(field)):
        load_settings([], {env_name(field): str(GRPC_INT_MAX + 1)})


@pytest.mark.parametrize(
    "address",
    [
        "localhost:50051",
        "127.0.0.1:50051",
        "127.8.0.1:50051",
        "[::1]:50051",
        "dns:///localhost:50051",
        "dns://8.8.8.8/localhost:50051",
        "ipv4:127.0.0.1:50051,127.0.0.2:50051",
        "ipv6:[::1]:50051",
        "unix:/run/edgedistill.sock",
    ],
)
def test_an_address_on_this_machines_loopback_is_called_straight(address):
    assert on_loopback(address)


@pytest.mark.parametrize(
    "address",
    [
        "example.com:50051",
        "10.0.0.5:50051",
        "[2001:db8::1]:50051",
        "0.0.0.0:50051",
        "dns:///example.com:50051",
        "ipv4:127.0.0.1:50051,10.0.0.5:50051",
    ],
)
def test_an_address_off_the_loopback_keeps_the_environments_proxy(address):
    assert not on_loopback(address)


@pytest.mark.parametrize(("host", "loopback"), [("::1", True), ("[::1]", True), ("localhost", True), ("[::]", False)])
def test_a_host_to_bind_is_told_on_the_loopback_written_with_brackets_or_not(host, loopback):
    assert loopback_host(host) is loopback


def test_the_streams_of_one_connection_default_to_twice_the_calls_in_progress():
    settings = load_settings([], {"EDGEDISTILL_MAX_CONCURRENT_RPCS": "300"})
    assert settings.streams_per_connection == 600


def test_the_streams_of_one_connection_set_are_as_set():
    settings = load_settings(["--max-concurrent-streams", "40"], {"EDGEDISTILL_MAX_CONCURRENT_RPCS": "300"})
    assert settings.streams_per_connection == 40


def test_the_default_streams_of_one_connection_stay_within_what_grpc_takes():
    settings = load_settings([], {"EDGEDISTILL_MAX_CONCURRENT_RPCS": str(GRPC_INT_MAX)})
    assert settings.streams_per_connection == GRPC_INT_MAX
