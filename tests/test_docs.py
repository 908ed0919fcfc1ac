"""The README and docs/: a short front door, links that resolve, tables that match the code.

The README's import table is checked against each package's imports. The settings tables in docs/settings.md
are written by hand and checked against the settings' own fields: every field has a row, and its name, default
and description (where the field has one) are the field's; so is the metrics table in docs/serving.md, against the
server's metrics. A failing check prints the rows to paste. The README's stage table is checked against the
commands `edgedistill all` runs, docs/install.md's extras against pyproject.toml, and the examples the pages and
the commands' help give (bundle folders, make's error lines, the targets of make commands) against the recipes and
the Makefile.
"""

import ast
import contextlib
import io
import json
import re
import tomllib
from pathlib import Path
from types import NoneType, UnionType
from typing import Union, get_args, get_origin

import pytest
import yaml
from edgedistill.common import settings as common_settings
from edgedistill.common.manifest import MANIFEST, Manifest
from edgedistill.common.recipe import Recipe, load_recipe
from edgedistill.serve import settings as serve_settings
from edgedistill.serve.exposition import WORKER_PROCESS
from edgedistill.serve.metrics import LATENCY_BUCKETS, Metrics
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from edgedistill import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAKEFILE = ROOT / "Makefile"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
SETTINGS_PAGE = DOCS / "settings.md"
PIPELINE_PAGE = DOCS / "pipeline.md"
INSTALL_PAGE = DOCS / "install.md"
SERVING_PAGE = DOCS / "serving.md"
README_MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CELL_SPLIT = re.compile(r"(?<!\\)\|")
ENV_READ = re.compile(r"""os\.environ(?:\.get\(|\[)\s*["']([A-Z][A-Z0-9_]*)["']""")
ENV_CONSTANT = re.compile(r"""^[A-Z_]*_VAR\s*=\s*["']([A-Z][A-Z0-9_]*)["']""", re.MULTILINE)
MAKE_DEFAULT = re.compile(r"^([A-Z][A-Z0-9_]*)\s*\?=", re.MULTILINE)
MAKE_ERROR = re.compile(r"\[Makefile:(\d+): ([\w-]+)\]")  # make's line for a failed command
MAKE_COMMAND = re.compile(r"(?:`|^)(?:sudo )?make ((?:[a-z][a-z0-9-]*(?: |`|$))+)", re.MULTILINE)  # its goals
MAKE_TARGET = re.compile(r"^([a-z][a-z0-9-]*):", re.MULTILINE)
REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?")  # a name, its extras
BUNDLE_PATH = re.compile(r"runs/([\w.-]+)/bundle-([a-z0-9][a-z0-9-]*[a-z0-9])")  # an example: recipe, bundle id
GUIDE_PAGE = re.compile(r"""guide\.page\(\s*["']([\w.-]+)["'](?:\s*,\s*["']([\w-]+)["'])?""")  # a page code names
BENCH_COMMANDS = re.compile(r"\{([a-z,]+)\}")  # `edgedistill bench --help`'s list of benchmarks
TOP_LEVEL = "Top level"
HEAVY = {"torch", "transformers"}  # the serving image carries neither


# --- markdown -----------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(page).splitlines() if line.startswith("#")}


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page)) if "://" not in target and not target.startswith("mailto:")]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in CELL_SPLIT.split(line.strip().strip("|"))]


def tables(page: Path) -> dict[str, list[list[str]]]:
    """Heading text (without #s) -> the rows of the tables under it, header and separator left out."""
    found: dict[str, list[list[str]]] = {}
    heading = None
    header_seen = False
    for line in prose(page).splitlines():
        if line.startswith("#"):
            heading, header_seen = line.lstrip("#").strip(), False
            found[heading] = []
        elif line.startswith("|") and heading is not None:
            if set(line) <= set("|- "):
                header_seen = True
            elif header_seen:
                found[heading].append(cells(line))
        else:
            header_seen = False
    return found


# --- rendering what the models say ----------------------------------------------------------------------------


def value(item) -> str:
    """A default as it is written in YAML or on the command line, in backticks; `(none)` for None."""
    if item is None:
        return "(none)"
    if isinstance(item, BaseModel):
        item = item.model_dump(mode="json", exclude_defaults=True)
    if isinstance(item, Path):
        item = str(item)
    if isinstance(item, str):
        return f"`{item}`"
    text = yaml.safe_dump(item, default_flow_style=True, sort_keys=False, width=10_000).removesuffix("...\n")
    return f"`{text.strip()}`"


def description(info: FieldInfo) -> str:
    return (info.description or "").replace("|", "\\|")


def defaults_of(model: type[BaseModel]) -> dict[str, str]:
    """Field -> its default as written in the docs; a model valid without keys gives its effective defaults
    (presets applied by its validators), otherwise each field's own default, where its value comes from when none is
    given (`default_from`, e.g. the recipe's name, from its file's), or `(required)`."""
    try:
        instance = model.model_validate({})
    except ValidationError:
        instance = None
    out = {}
    for name, info in model.model_fields.items():
        if instance is not None:
            out[name] = value(getattr(instance, name))
        elif info.is_required():
            out[name] = (info.json_schema_extra or {}).get("default_from", "(required)")
        else:
            out[name] = value(info.get_default(call_default_factory=True))
    return out


def submodels(annotation) -> list[tuple[str, type[BaseModel]]]:
    """The config models a field holds: itself (''), inside an Optional (''), or as dict values ('.<name>')."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        return [found for arg in get_args(annotation) if arg is not NoneType for found in submodels(arg)]
    if origin is dict:
        return [(".<name>" + suffix, model) for suffix, model in submodels(get_args(annotation)[1])]
    return []


def recipe_models() -> dict[type[BaseModel], list[str]]:
    """Every config model reachable from `Recipe` -> the dotted recipe paths where it appears, in order."""
    paths: dict[type[BaseModel], list[str]] = {Recipe: [""]}
    pending = [(Recipe, "")]
    while pending:
        model, prefix = pending.pop(0)
        for name, info in model.model_fields.items():
            for suffix, sub in submodels(info.annotation):
                path = f"{prefix}{name}{suffix}"
                pending.append((sub, path + "."))
                paths.setdefault(sub, []).append(path)
    return paths


def recipe_heading(model_paths: list[str]) -> str:
    return TOP_LEVEL if model_paths == [""] else ", ".join(f"`{path}`" for path in model_paths)


def recipe_row(name: str, default: str, info: FieldInfo) -> str:
    return f"| `{name}` | {default} | {description(info)} |"


def server_row(name: str, info: FieldInfo) -> str:
    env, flag = serve_settings.env_name(name), serve_settings.flag_name(name)
    return f"| `{env}` | `{flag}` | {value(info.default)} | {description(info)} |"


def project_packages() -> list[Path]:
    return sorted(folder for folder in ROOT.iterdir() if (folder / "__init__.py").is_file() and folder.name != "tests")


def top_name(module: str) -> str:
    """The project package a module is in (`edgedistill.serve.app` -> serve), else its top-level name."""
    top, _, rest = module.partition(".")
    return rest.partition(".")[0] if top == "edgedistill" and rest else top


def imported(package: Path) -> set[str]:
    """Top-level names of the modules a package imports anywhere (also inside functions), itself left out."""
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {top_name(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(top_name(node.module))
    return names - {package.name}


def make_goals(page: Path) -> set[str]:
    """The targets of the `make` commands a page gives, in its code spans and at the start of its code blocks' lines."""
    text = page.read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"```.*?```", text, flags=re.DOTALL) + re.findall(r"`[^`\n]+`", prose(page)))
    return {goal.strip("`") for goals in MAKE_COMMAND.findall(code) for goal in goals.split()}


def command_lines(target: str) -> range:
    """The Makefile's line numbers (from 1) of `target`'s commands: the tab-indented lines below its rule."""
    lines = MAKEFILE.read_text(encoding="utf-8").splitlines()
    rule = next(index for index, line in enumerate(lines) if line.startswith(f"{target}:"))
    end = rule + 1
    while end < len(lines) and lines[end].startswith("\t"):
        end += 1
    return range(rule + 2, end + 1)


def building_steps() -> list[str]:
    """The commands `edgedistill all` runs that build an artifact, as `bench models` (the words before the recipe)."""
    steps = cli.pipeline("RECIPE", cli.JOBS, [])
    return [" ".join(step[: step.index("RECIPE")]) for step in steps if step[0] not in cli.BUILD_NOTHING]


def extras() -> dict[str, list[str]]:
    """pyproject.toml's extras -> what each adds as docs/install.md writes it: a package's name in lower case,
    another extra of the project as `name` in backticks."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    out = {}
    for extra, requirements in declared.items():
        out[extra] = []
        for requirement in requirements:
            name, included = REQUIREMENT.match(requirement).groups()
            own = name == "edgedistill"
            out[extra] += [f"`{other}`" for other in included.split(",")] if own else [name.lower()]
    return out


def command_help(words: list[str]) -> str:
    """What `edgedistill <words> --help` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main([*words, "--help"])
    return out.getvalue()


def commands() -> list[list[str]]:
    """Every `edgedistill` command with a help of its own, each benchmark of `bench` among them."""
    benchmarks = BENCH_COMMANDS.search(command_help(["bench"])).group(1).split(",")
    return [[name] for name in [*cli.COMMANDS, "all"]] + [["bench", name] for name in benchmarks]


def bundles_of(recipe_name: str) -> set[str]:
    """The ids of the bundles and cascades a shipped recipe builds."""
    export = load_recipe(ROOT / "recipes" / f"{recipe_name}.yaml").export
    return set(export.bundles) | set(export.cascades) if export else set()


# --- the checks --------------------------------------------------------------------------------------------


def test_the_readme_is_under_250_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_links_to_every_docs_page():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in links(README)}
    unlinked = [page.name for page in DOCS.glob("*.md") if page.resolve() not in linked]
    assert not unlinked, f"README.md does not link to docs/{unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_relative_links_point_at_existing_files(page):
    broken = [target for target in links(page) if not (page.parent / target.partition("#")[0]).exists()]
    assert not broken, f"{page.name}: links to missing files {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_anchors_of_links_name_headings_of_their_page(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if anchor and linked.suffix == ".md" and linked.is_file() and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{page.name}: links to missing headings {broken}"


@pytest.mark.parametrize("package", project_packages(), ids=lambda package: package.name)
def test_packages_import_only_what_the_readme_allows(package):
    rows = {row[0]: row for row in tables(README).get("Layout", [])}
    assert f"`{package.name}/`" in rows, f"README.md, section Layout: no row for {package.name}/"
    allowed = set(re.findall(r"`([a-z_]+)`", rows[f"`{package.name}/`"][1]))
    guarded = {other.name for other in project_packages()} | HEAVY
    forbidden = imported(package) & guarded - allowed
    assert not forbidden, f"{package.name}/ imports {sorted(forbidden)}, which README.md (Layout) does not allow"


@pytest.mark.parametrize("step", building_steps())
def test_the_readme_stage_table_gives_every_command_edgedistill_all_runs(step):
    commands = " ".join(row[1] for row in tables(README)["Stages"])
    assert f"`edgedistill {step} RECIPE" in commands, f"README.md, section Stages: no row for `edgedistill {step}`"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_a_quoted_make_error_gives_the_makefile_line_of_its_targets_command(page):
    quoted = MAKE_ERROR.findall(prose(page))
    wrong = {
        f"Makefile:{line}: {target}": f"{target}'s command is on line {lines[0]}-{lines[-1]}"
        for line, target in quoted
        if int(line) not in (lines := command_lines(target))
    }
    assert not wrong, f"{page.name}: quotes make's line for a failed command wrongly: {wrong}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_a_make_command_a_page_gives_names_targets_of_the_makefile(page):
    targets = set(MAKE_TARGET.findall(MAKEFILE.read_text(encoding="utf-8")))
    assert sorted(make_goals(page) - targets) == [], f"{page.name}: the Makefile has no such target"


@pytest.mark.parametrize("extra", list(extras()))
def test_the_extras_table_lists_what_each_extra_adds(extra):
    rows = {row[0]: row for row in tables(INSTALL_PAGE)["Extras"]}
    documented = sorted(item.strip().lower() for item in rows[f"`{extra}`"][2].split(","))
    assert documented == sorted(extras()[extra]), f"docs/install.md, section Extras: `{extra}` adds {extras()[extra]}"


def test_the_extras_table_names_only_the_projects_extras():
    documented = [row[0] for row in tables(INSTALL_PAGE)["Extras"]]
    assert sorted(documented) == sorted(f"`{extra}`" for extra in extras())


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_a_bundle_folder_a_page_names_is_one_its_recipe_builds(page):
    named = set(BUNDLE_PATH.findall(page.read_text(encoding="utf-8")))
    unbuilt = sorted(f"runs/{run}/bundle-{bundle}" for run, bundle in named if bundle not in bundles_of(run))
    assert not unbuilt, f"{page.name}: no recipe builds {unbuilt}"


@pytest.mark.parametrize("command", commands(), ids=" ".join)
def test_a_bundle_folder_a_commands_help_names_is_one_its_recipe_builds(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "10000")  # argparse would wrap a long path at its hyphens
    named = set(BUNDLE_PATH.findall(command_help(command)))
    unbuilt = sorted(f"runs/{run}/bundle-{bundle}" for run, bundle in named if bundle not in bundles_of(run))
    assert not unbuilt, f"edgedistill {' '.join(command)} --help: no recipe builds {unbuilt}"


def test_every_server_setting_has_its_row():
    rows = {row[0]: row for row in tables(SETTINGS_PAGE).get("Server", [])}
    wrong = [
        server_row(name, info)
        for name, info in serve_settings.Settings.model_fields.items()
        if rows.get(f"`{serve_settings.env_name(name)}`") != cells(server_row(name, info))
    ]
    assert not wrong, "docs/settings.md, section Server: add or fix these rows:\n" + "\n".join(wrong)


def test_the_server_table_names_only_existing_settings():
    known = {f"`{serve_settings.env_name(name)}`" for name in serve_settings.Settings.model_fields}
    extra = [row[0] for row in tables(SETTINGS_PAGE).get("Server", []) if row[0] not in known]
    assert not extra, f"docs/settings.md, section Server: no such setting {extra}"


@pytest.mark.parametrize("model", list(recipe_models()), ids=lambda model: model.__name__)
def test_every_recipe_field_has_its_row(model):
    heading = recipe_heading(recipe_models()[model])
    rows = {row[0]: row for row in tables(SETTINGS_PAGE).get(heading, [])}
    defaults = defaults_of(model)
    wrong = []
    for name, info in model.model_fields.items():
        row = rows.get(f"`{name}`")
        expected = cells(recipe_row(name, defaults[name], info))
        if row is None or row[1] != expected[1] or (info.description and row[2] != expected[2]):
            wrong.append(recipe_row(name, defaults[name], info))
    assert not wrong, f"docs/settings.md, section `### {heading}`: add or fix these rows:\n" + "\n".join(wrong)


@pytest.mark.parametrize("model", list(recipe_models()), ids=lambda model: model.__name__)
def test_recipe_tables_name_only_existing_fields(model):
    heading = recipe_heading(recipe_models()[model])
    known = {f"`{name}`" for name in model.model_fields}
    extra = [row[0] for row in tables(SETTINGS_PAGE).get(heading, []) if row[0] not in known]
    assert not extra, f"docs/settings.md, section `### {heading}`: no such field {extra}"


def test_the_settings_page_has_a_table_for_every_recipe_section_and_no_other():
    headings = {recipe_heading(paths) for paths in recipe_models().values()}
    page = tables(SETTINGS_PAGE)
    recipe_part = {heading for heading in page if heading == TOP_LEVEL or heading.startswith("`")}
    assert recipe_part == headings


def test_the_manifest_table_lists_every_key_of_a_manifest_and_no_other():
    documented = [row[0].strip("`") for row in tables(PIPELINE_PAGE)[MANIFEST]]
    assert documented == list(Manifest.model_fields)


def test_every_environment_variable_the_code_reads_is_documented():
    names = set(common_settings.defaults())
    for path in (path for package in project_packages() for path in package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        names |= set(ENV_READ.findall(text)) | set(ENV_CONSTANT.findall(text))
    documented = {row[0].strip("`") for row in tables(SETTINGS_PAGE).get("Environment", [])}
    assert not names - documented, f"docs/settings.md, section Environment: add {sorted(names - documented)}"


def guide_pages() -> list[tuple[str, str]]:
    """(page, anchor) for each page of docs/ the code names in a message (`common.guide.page`)."""
    sources = (path.read_text(encoding="utf-8") for package in project_packages() for path in package.rglob("*.py"))
    return sorted({named for text in sources for named in GUIDE_PAGE.findall(text)})


@pytest.mark.parametrize(("name", "anchor"), guide_pages())
def test_a_page_a_message_names_exists_with_its_heading(name, anchor):
    assert (DOCS / name).is_file(), f"docs/{name}: no such page"
    assert not anchor or anchor in anchors(DOCS / name), f"docs/{name}: no heading #{anchor}"


def test_every_make_variable_with_a_default_is_documented():
    names = set(MAKE_DEFAULT.findall((ROOT / "Makefile").read_text(encoding="utf-8")))
    documented = {row[0].strip("`") for row in tables(SETTINGS_PAGE).get("Make variables", [])}
    assert not names - documented, f"docs/settings.md, section Make variables: add {sorted(names - documented)}"


def test_the_make_variables_checked_for_typos_are_those_documented():
    listed = re.search(r"^VARIABLES := ((?:.*\\\n)*.*)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    documented = {row[0].strip("`") for row in tables(SETTINGS_PAGE).get("Make variables", [])}
    assert set(listed.group(1).replace("\\", " ").split()) == documented


def metric_row(metric: MetricWrapperBase) -> str:
    name = metric._name + ("_total" if metric._type == "counter" else "")  # a counter's samples add `_total`
    labels = ", ".join(f"`{label}`" for label in metric._labelnames)
    return f"| `{name}` | {metric._type} | {labels} | {metric._documentation} |"


def test_the_process_metrics_table_lists_every_workers_metric_with_its_type_and_help():
    documented = tables(SERVING_PAGE).get("Process metrics", [])
    expected = [
        f"| `{name}{'_total' if kind.__name__.startswith('Counter') else ''}` | "
        f"{kind.__name__.removesuffix('MetricFamily').lower()} | `worker` | {doc} |"
        for name, doc, kind in WORKER_PROCESS.values()
    ]
    assert documented == [cells(row) for row in expected], "docs/serving.md, Process metrics: the rows should be:\n" + (
        "\n".join(expected)
    )


def test_the_metrics_table_lists_every_metric_with_its_type_labels_and_help():
    metrics = [value for value in vars(Metrics()).values() if isinstance(value, MetricWrapperBase)]
    documented = tables(SERVING_PAGE).get("Metrics", [])
    expected = [metric_row(metric) for metric in metrics]
    assert documented == [cells(row) for row in expected], "docs/serving.md, section Metrics: the rows should be:\n" + (
        "\n".join(expected)
    )
    buckets = ", ".join(f"{edge:g}" for edge in LATENCY_BUCKETS[:-1]) + f" and {LATENCY_BUCKETS[-1]:g} s"
    assert buckets in " ".join(prose(SERVING_PAGE).split()), f"docs/serving.md: the latency buckets are {buckets}"


def test_the_errors_table_names_every_status_a_handler_sets():
    from edgedistill.serve.transport import STATUS_CODES

    documented = {row[0].strip("`") for row in tables(SERVING_PAGE).get("Errors", [])}
    expected = {code.name for code in STATUS_CODES.values()} | {"INTERNAL", "UNAUTHENTICATED"}
    assert sorted(expected - documented) == []


def test_the_retry_service_config_in_the_serving_page_is_the_python_clients():
    from edgedistill.serve.client import retry_options

    block = re.search(r"```json\n(.*?)```", SERVING_PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert json.loads(block.group(1)) == json.loads(dict(retry_options(3))["grpc.service_config"])
