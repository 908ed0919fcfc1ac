"""The one contract between stages: an artifact folder holding `manifest.json`.

A stage builds its folder under a temporary name and renames it into place, so a killed
stage never leaves a half-written artifact behind; loading verifies every file's sha256. The model
card (`README.md` at the top of the folder) is the one file left out: it is written from the manifest
after publishing and rewritten as later figures appear (`common.modelcard`).
"""

import difflib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

from edgedistill.common.atomic import atomic_write, publish_folder, remove_orphans, space_checked, temporary_name
from edgedistill.common.names import first_of
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MANIFEST = "manifest.json"
CARD = "README.md"
TRACKED_PACKAGES = ("torch", "transformers", "tokenizers", "onnx", "onnxruntime", "onnxruntime-gpu", "grpcio")


class ArtifactError(RuntimeError):
    """An artifact folder that is missing, incomplete or does not match its manifest."""


def invalid(what: str, err: ValidationError) -> ArtifactError:
    """The error for a manifest or spec that fails validation: each problem as `key: message`, without pydantic's
    input dumps and links."""
    problems = []
    for error in err.errors():
        key = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        problems.append(f"{key}: {message}" if key else message)
    return ArtifactError(f"{what}: {'; '.join(problems)}")


class FileEntry(BaseModel):
    sha256: str
    size_bytes: int


class Parent(BaseModel):
    path: str
    manifest_sha256: str


class Manifest(BaseModel):
    model_config = ConfigDict(extra="allow")

    stage: str
    recipe: str
    recipe_hash: str
    config_hash: str = Field(description="hash of the recipe sections this stage depends on")
    hashed: dict[str, Any] = Field(
        {}, description="what config_hash covers (settings, extra, parents' and artifacts' hashes), to say what changed"
    )
    parents: dict[str, Parent] = {}
    files: dict[str, FileEntry] = {}
    metrics: dict[str, Any] = {}
    info: dict[str, Any] = {}
    versions: dict[str, str] = {}
    created: str = ""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def package_versions() -> dict[str, str]:
    found = {}
    for name in TRACKED_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def finished(root: Path) -> list[Path]:
    """The finished artifact folders in the run folder `root`, by name: those holding a manifest, not the hidden
    temporary names (`.teacher.tmp-<pid>`) a publish killed half-way leaves until its stage runs again."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if not p.name.startswith(".") and (p / MANIFEST).is_file())


def parent_of(folder: Path) -> Parent:
    """A reference to an existing artifact, pinned by its manifest's hash."""
    return Parent(path=str(folder), manifest_sha256=sha256_file(Path(folder) / MANIFEST))


def listed_file(folder: Path, name: str) -> Path:
    """The path of the file a manifest lists as `name`; `ArtifactError` unless it lies inside `folder`: no
    absolute path, no `..`, no symlink (of the file or a folder on its way) that leads out or loops."""
    relative = PurePosixPath(name)
    if "\x00" in name:  # no file system takes it; os.path would raise ValueError
        raise ArtifactError(f"{folder}: the manifest lists {name!r}, a name with a NUL character that no file can have")
    if not name or relative.is_absolute() or ".." in relative.parts:
        raise ArtifactError(f"{folder}: the manifest lists {name!r}, a path outside the artifact folder")
    file = folder / relative
    try:
        inside = file.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop, before Python 3.13
        raise ArtifactError(f"{folder}: the manifest lists {name!r}, a path that cannot be followed: {err}") from err
    if not inside:
        raise ArtifactError(f"{folder}: the manifest lists {name!r}, a symlink that leads out of the artifact folder")
    return file


def missing_file(folder: Path, name: str) -> ArtifactError:
    """The error for a listed file that is not there."""
    return ArtifactError(f"{folder}: {name} is listed in the manifest but missing")


def wrong_size(folder: Path, name: str, size: int, recorded: int) -> ArtifactError:
    """The error for a listed file whose size is not the one its manifest records."""
    how = "truncated?" if size < recorded else "written to since?"
    return ArtifactError(f"{folder}: {name} has {size} bytes, the manifest says {recorded} ({how})")


def wrong_sha256(folder: Path, name: str) -> ArtifactError:
    """The error for a listed file whose contents are not the ones its manifest records."""
    return ArtifactError(f"{folder}: {name} does not match its sha256 in the manifest (corrupted or edited)")


# The command that builds a run's folder, by the folder's name (or its start, where it ends with "-").
BUILT_BY = {
    "pretrain": "pretrain",
    "teacher": "teacher",
    "transfer": "transfer",
    "student-": "distill",
    "baseline-": "distill",
    "bundle-": "bundles",
    "bench": "bench models",
}


def build_with(command: str, again: bool = False) -> str:
    """The advice to run `command` (a `BUILT_BY` one) for a missing artifact (or, `again`, a damaged one)."""
    return f"build it{' again' if again else ''}: edgedistill {command} RECIPE"


def how_to_build(folder: Path, again: bool = False) -> str:
    """What to run for a missing artifact (or, `again`, a damaged one): the command that builds a folder of that name,
    else its stage."""
    name = folder.name
    matches = (run for start, run in BUILT_BY.items() if name == start or (start[-1] == "-" and name.startswith(start)))
    if command := next(matches, None):
        return build_with(command, again)
    return "run its stage again to rebuild it" if again else "run its stage first"


def unfinished(folder: Path) -> str:
    """Why `folder`, which has no manifest, is no artifact, and what to do: for a file, its folder; for a folder
    holding finished artifacts (a run folder), their names; for a folder that does not exist, the finished artifact
    beside it of the nearest name, if any (a misspelt path); else the command that builds it."""
    if folder.is_file():  # the manifest or a file of the artifact, named instead of its folder
        return f"{folder} is a file, not an artifact folder: give its folder, {folder.parent}"
    why = f"{folder} is not a finished artifact: {MANIFEST} is missing"
    if folder.is_dir():
        if inside := [child.name for child in finished(folder)]:  # a run folder, named for one of its artifacts
            return f"{why}; it holds finished artifacts ({first_of(inside, 8)}): name one of them"
        return f"{why} ({how_to_build(folder)})"
    try:
        beside = [other.name for other in finished(folder.parent)]
    except OSError:  # no such parent either
        beside = []
    # a name of a kind (bundle-..., student-...) is answered with one of that kind alone: a bundle is no student
    kinds = [start for start in BUILT_BY if start.endswith("-") and folder.name.startswith(start)]
    near = difflib.get_close_matches(folder.name, [name for name in beside if name.startswith(tuple(kinds) or "")], n=1)
    hint = f"did you mean {folder.parent / near[0]}? else " if near else ""
    return f"{why}, as the folder does not exist ({hint}{how_to_build(folder)})"


def read(folder: str | Path, verify: bool = True) -> tuple[Manifest, str]:
    """`load`, and the sha256 of the very manifest bytes parsed (what a server reports as loaded)."""
    folder = Path(folder)
    path = folder / MANIFEST
    try:
        if not path.is_file():
            raise ArtifactError(unfinished(folder))
        data = path.read_bytes()
    except OSError as err:  # unreadable, a name too long, not a folder: the reason, not a traceback
        raise ArtifactError(f"cannot read {path}: {err}") from err
    try:
        manifest = Manifest.model_validate_json(data)
    except ValidationError as err:
        raise invalid(f"{path} is not a valid manifest", err) from None
    for name in manifest.files:
        listed_file(folder, name)
    if verify:
        verified(folder, manifest)
    return manifest, hashlib.sha256(data).hexdigest()


def verified(folder: Path, manifest: Manifest, keep: Iterable[str] = ()) -> dict[str, bytes]:
    """The bytes of the listed files named in `keep`, each read once; `ArtifactError` unless every listed file is
    there with the size and sha256 its manifest records, checked on the bytes read, and the folder holds no file
    its manifest leaves out (`unlisted`)."""
    keep = set(keep)
    kept = {name: _checked(folder, name, entry, name in keep) for name, entry in manifest.files.items()}
    if added := next(iter(unlisted(folder, manifest)), None):
        raise ArtifactError(
            f"{folder}: {added} is in the folder but not in its manifest (added since?), and a loader would read "
            "it: remove it"
        )
    return {name: kept[name] for name in keep}


def _checked(folder: Path, name: str, entry: FileEntry, keep: bool) -> bytes | None:
    """The listed file `name` checked against its manifest `entry` on the bytes read; those bytes if `keep`."""
    try:
        with open(listed_file(folder, name), "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != entry.size_bytes:
                raise wrong_size(folder, name, size, entry.size_bytes)
            if keep:
                data = handle.read(size + 1)  # one byte more shows a file that grew since
                digest = hashlib.sha256(data)
            else:  # hashed without holding it
                data, digest = None, hashlib.file_digest(handle, "sha256")
    except (FileNotFoundError, IsADirectoryError):
        raise missing_file(folder, name) from None
    if digest.hexdigest() != entry.sha256:
        raise wrong_sha256(folder, name)
    return data


def _listable(folder: Path) -> list[str]:
    """The files in `folder` a manifest lists, by their paths in it: all but its manifest, its card and hidden ones
    (`.DS_Store`, an editor's, which are let be)."""
    names = (file.relative_to(folder).as_posix() for file in sorted(folder.rglob("*")) if file.is_file())
    return [
        name
        for name in names
        if name not in (MANIFEST, CARD) and not any(part.startswith(".") for part in name.split("/"))
    ]


def unlisted(folder: Path, manifest: Manifest) -> list[str]:
    """The files in `folder` its manifest does not list (`_listable` ones): a Hugging Face loader reads what a folder
    holds (a `special_tokens_map.json` added would change the padding)."""
    return [name for name in _listable(folder) if name not in manifest.files]


def load(folder: str | Path, verify: bool = True) -> Manifest:
    """Read `folder/manifest.json`, refusing listed files outside the folder; with `verify`, check every listed
    file's size and sha256 and refuse files it does not list (`verified`)."""
    return read(folder, verify)[0]


def staleness(
    folder: Path,
    config_hash: str,
    parents: dict[str, Path] | None = None,
    hashed: dict | None = None,
    unread: Iterable[str] = (),
) -> str | None:
    """Why `folder` must be built again, or None when it holds a finished artifact built from the same config
    (`same_config`) and from the artifacts now in the `parents` folders (name -> folder), with every listed file as
    the manifest records it. The parents are looked up where they are now, not where they were when `folder` was
    built: a runs folder copied or moved elsewhere is judged by its own artifacts. A parent the manifest records
    beyond `parents` (an artifact the build chose to read) is looked up beside `folder` by its folder's name. `hashed`
    (what `config_hash` covers) names the settings that changed."""
    if not (Path(folder) / MANIFEST).is_file():
        return "not built yet"
    try:
        manifest = load(folder, verify=True)
    except ArtifactError as err:
        return str(err)
    if not same_config(manifest, config_hash, hashed, unread):
        if not (manifest.hashed and hashed):
            return "its settings or a parent's changed"
        return changes(without(manifest.hashed, unread), hashed)
    parents = parents or {}
    read = {name: path for name, path in beside(folder, manifest).items() if name not in parents}
    return parent_change(manifest, parents | read)


def same_config(manifest: Manifest, config_hash: str, hashed: dict | None, unread: Iterable[str] = ()) -> bool:
    """Whether `manifest`'s artifact was built from the config of `config_hash`: its hash is that one, or what it
    records it hashed differs from `hashed` only by settings in `unread` (ones an earlier release hashed for the stage,
    which it does not read)."""
    if manifest.config_hash == config_hash:
        return True
    if not (unread and manifest.hashed and hashed):
        return False
    return json.dumps(without(manifest.hashed, unread), sort_keys=True) == json.dumps(hashed, sort_keys=True)


def without(hashed: dict, unread: Iterable[str]) -> dict:
    """A `hashed` record without the settings in `unread`."""
    unread = set(unread)
    settings = {key: value for key, value in hashed.get("settings", {}).items() if key not in unread}
    return hashed | {"settings": settings}


def parent_change(manifest: Manifest, parents: dict[str, Path], gone_ok: bool = False) -> str | None:
    """Why `manifest`'s artifact was not built from the artifacts now in the `parents` folders (name -> folder): one
    is missing (unless `gone_ok`) or was built again since; None when it was built from them all."""
    for name, parent_folder in parents.items():
        recorded = manifest.parents.get(name)
        parent_manifest = Path(parent_folder) / MANIFEST
        if not parent_manifest.is_file():
            if gone_ok:
                continue
            return f"its parent {name} is missing ({parent_folder})"
        if recorded is None or sha256_file(parent_manifest) != recorded.manifest_sha256:
            return f"its parent {name} was built again"
    return None


def beside(folder: Path, manifest: Manifest) -> dict[str, Path]:
    """Each parent `manifest` records (name -> folder), looked up beside `folder` in its run folder by its folder's
    name."""
    return {name: Path(folder).parent / Path(p.path).name for name, p in manifest.parents.items()}


def built_from_others(folder: Path) -> str | None:
    """Why the finished artifact in `folder` was not built from the artifacts now beside it in its run folder
    (`parent_change`), or was built on one out of date (`parent_out_of_date`); None when neither."""
    manifest = load(folder, verify=False)
    parents = beside(folder, manifest)
    return parent_change(manifest, parents) or parent_out_of_date(parents)


def out_of_date(folder: Path) -> str | None:
    """Why the finished artifact in `folder`, or one it was built from, was not built from an artifact now beside it
    (one built again since), told from the manifests alone; None where none was, or where `folder` holds none. A
    parent removed since changes nothing built on it (a run kept without its pretraining)."""
    if not (Path(folder) / MANIFEST).is_file():
        return None
    try:
        manifest = load(folder, verify=False)
    except ArtifactError as err:
        return str(err)
    parents = beside(folder, manifest)
    return parent_change(manifest, parents, gone_ok=True) or parent_out_of_date(parents)


def parent_out_of_date(parents: dict[str, Path]) -> str | None:
    """Why one of the `parents` folders (name -> folder) holds an artifact out of date (`first_out_of_date`), naming
    it; None where none does. A settings change needs no such walk: a stage's hash covers its parents'."""
    found = first_out_of_date(parents)
    return f"its parent {found[0]} is out of date ({found[1]})" if found else None


def first_out_of_date(parents: dict[str, Path]) -> tuple[str, str] | None:
    """The name of the first of the `parents` folders (name -> folder) that holds an artifact out of date, and why
    (`out_of_date`); None where none does."""
    return next(((name, why) for name, folder in parents.items() if (why := out_of_date(folder))), None)


GONE_ADVICE = (
    "set EDGEDISTILL_DATA_DIR or EDGEDISTILL_TEACHER_INIT where the recipe reads it from them, or fix the path"
)


def gone(value) -> bool:
    """Whether a recorded setting's value names a local file or folder that does not exist, which a stage's hash takes
    as written (`common.recipe.by_content`): a path absolute, from the home folder, relative by `./` or `../`, or
    deeper than a Hub name's `namespace/name`."""
    if not isinstance(value, str):
        return False
    local = value.startswith(("/", "./", "../", "~")) or (value.count("/") >= 2 and ":" not in value)
    return local and not os.path.lexists(os.path.expanduser(value))


def gone_paths(settings: dict, prefix: str = "") -> list[str]:
    """`key: path` of each value in a `hashed` record's settings that is `gone`, by dotted key (`[i]` in a list)."""
    found = []
    for key, value in settings.items():
        found += _gone_in(value, f"{prefix}{key}")
    return found


def _gone_in(value, key: str) -> list[str]:
    if isinstance(value, dict):
        return gone_paths(value, f"{key}.")
    if isinstance(value, list):
        return [path for index, item in enumerate(value) for path in _gone_in(item, f"{key}[{index}]")]
    return [f"{key}: {value}"] if gone(value) else []


def changes(old: dict, new: dict, most: int = 3) -> str:
    """What differs between two `hashed` records (or records of their settings alone), e.g. `finetune.optim.lr 0.001 ->
    0.002; data.train: its contents changed; parent teacher's settings changed; now also built from transfer; bundle
    is another artifact or was rebuilt`: at most `most` of them, then how many more. A setting or extra the old record
    lacks whole (one a later release hashes) is said once, `server: not recorded when it was built`, not as each of
    its values changed from null, and one the new record lacks whole (the transfer set's labeller, dropped) as
    `labeller: not recorded now`; a parent it lacks, as `now also built from <name>`."""
    recorded, hashed = old.get("settings", {}) | old.get("extra", {}), new["settings"] | new.get("extra", {})
    added = sorted(name for name in hashed.keys() - recorded.keys() if hashed[name] is not None)
    dropped = sorted(name for name in recorded.keys() - hashed.keys() if recorded[name] is not None)
    said = [f"{name}: not recorded when it was built" for name in added]
    said += [f"{name}: not recorded now" for name in dropped]
    before = _flat({name: value for name, value in recorded.items() if name not in dropped})
    after = _flat({name: value for name, value in hashed.items() if name not in added})
    # a setting given or dropped (`model.init` set, which the sizes it makes unread follow) before values changed
    for key in sorted(before.keys() | after.keys(), key=lambda k: (None not in (before.get(k), after.get(k)), k)):
        was, now = before.get(key), after.get(key)
        if was == now:
            continue
        if all(isinstance(v, str) and v.startswith("sha256:") for v in (was, now)):
            said.append(f"{key}: its contents changed")
        elif gone_now := _gone_in(now, key):
            said.append(f"{'; '.join(gone_now)} not found ({GONE_ADVICE})")
        else:
            said.append(f"{key} {json.dumps(was)} -> {json.dumps(now)}")
    parents, artifacts = old.get("parents", {}), old.get("artifacts", {})
    said += [
        f"now also built from {name}"
        for name in new.get("parents", {}) | new.get("artifacts", {})
        if name not in parents | artifacts
    ]
    said += [
        f"parent {name}'s settings changed" for name, h in new.get("parents", {}).items() if parents.get(name, h) != h
    ]
    said += [
        f"{name} is another artifact or was rebuilt"
        for name, h in new.get("artifacts", {}).items()
        if artifacts.get(name, h) != h
    ]
    said = said or ["how its settings are recorded changed"]
    more = f"; and {len(said) - most} more" if len(said) > most else ""
    return "; ".join(said[:most]) + more


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}, "c": [2, 3]}` -> `{"a.b": 1, "c[0]": 2, "c[1]": 3}`, keyed as `gone_paths` names them (an
    empty list has no key, an empty dict its own)."""
    out = {}
    for key, value in tree.items():
        out |= _flat_value(value, f"{prefix}{key}")
    return out


def _flat_value(value, key: str) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        return _flat(value, f"{key}.")
    if isinstance(value, list):
        return {name: item for index, v in enumerate(value) for name, item in _flat_value(v, f"{key}[{index}]").items()}
    return {key: value}


@contextmanager
def stage_folder(final: Path):
    """Yield a temporary folder to fill; `commit(folder, manifest)` inside the block publishes it.

    A folder that was never committed is removed on exit, so no half artifact is left behind.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(final)
    tmp = temporary_name(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with space_checked(tmp, final.name):
            yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def commit(tmp: Path, final: Path, manifest: Manifest) -> Manifest:
    """Hash every `_listable` file in `tmp` (a manifest of a folder inside it, a cascade member's, is listed as any
    other file), write its manifest, and rename it to `final` (replacing any old one)."""
    tmp, final = Path(tmp), Path(final)
    files = {}
    for name in _listable(tmp):
        file = tmp / name
        files[name] = FileEntry(sha256=sha256_file(file), size_bytes=file.stat().st_size)
    manifest = manifest.model_copy(
        update={
            "files": files,
            "versions": package_versions(),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )
    atomic_write(tmp / MANIFEST, manifest.model_dump_json(indent=2))
    publish_folder(tmp, final)
    return manifest


def for_stage(
    recipe, stage: str, config_hash: str, watch: "Stopwatch", metrics: dict | None = None, **fields
) -> Manifest:
    """A manifest for `stage` of `recipe` (a `common.recipe.Recipe`), with its wall time among the metrics."""
    return Manifest(
        stage=stage,
        recipe=recipe.name,
        recipe_hash=recipe.hash,
        config_hash=config_hash,
        metrics=(metrics or {}) | {"wall_seconds": watch.seconds},
        **fields,
    )


class Stopwatch:
    """Wall time of a stage, for `wall_seconds`: from now, after the `earlier` seconds of the runs it resumes."""

    def __init__(self, earlier: float = 0.0):
        self.start, self.earlier = time.perf_counter(), earlier

    @property
    def seconds(self) -> float:
        return round(self.earlier + time.perf_counter() - self.start, 2)
