"""The stage contract: a stage declares its inputs once; the contract skips, verifies, times and publishes.

A `Stage` names its artifact folder, the recipe settings it depends on and its parent stages. Its
config hash covers its own settings and its parents' hashes, so a change anywhere upstream makes it
stale. `Stage.run` skips a current artifact; otherwise it loads (and verifies) every parent, calls
the build body, and publishes what the body returns as `runs/<recipe>/<name>/` with its manifest,
atomically, then prints one summary line. Parents are read only through `Inputs`, which verified them.
The settings a command's stages and their parents hash lie in the sections `common.sections` says the command
reads, whose overrides alone it takes.
"""

import contextlib
import hashlib
import importlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from edgedistill.common import locks, modelcard, progress, tracking
from edgedistill.common import manifest as mf
from edgedistill.common.atomic import atomic_write, remove_orphans
from edgedistill.common.machine import main_rank
from edgedistill.common.recipe import Recipe, by_content, run_dir

FORCED = "forced"  # in a scratch folder a forced run started: the key of the work it holds


@dataclass(frozen=True)
class Inputs:
    """What a build body may read: the recipe, its verified parents, and a scratch folder for resumable work."""

    recipe: Recipe
    config_hash: str
    work: Path
    force: bool
    manifests: dict[str, mf.Manifest]
    folders: dict[str, Path]
    work_key: str
    """What work left in `work` must have been made from to be resumed: `config_hash` and the parents as they are
    now, so a parent built again with the same settings (--force, a damaged file) is not built on half old."""
    folder: Path
    """The artifact folder the build publishes."""
    throwaway: list[Path] = field(default_factory=list)
    """The scratch folder once `fresh_work` gave it: a build that fails leaves nothing there to resume from."""

    def fresh_work(self) -> Path:
        """The scratch folder, emptied of what an interrupted run left there, for work that does not resume."""
        self.throwaway[:] = [self._empty_work()]
        return self.work

    def _empty_work(self) -> Path:
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        return self.work

    def resumable_work(self, key: str | None = None) -> Path:
        """The scratch folder for work that resumes (checkpoints, label shards). A forced run starts it afresh once:
        it empties the folder and marks it with `key` (default `work_key`), so that the same forced command, killed
        and run again, goes on from what the first left; it empties a folder another run left (a plain one, or a
        forced run of other settings), or one whose work was published since it was marked (a run killed between
        publishing and removing it). A plain run leaves the folder as it is, for the stage to check."""
        key = key or self.work_key
        marker = self.work / FORCED
        if self.force and not (marker.is_file() and marker.read_text() == key and not self._published_since(marker)):
            atomic_write(self._empty_work() / FORCED, key)
        return self.work

    def _published_since(self, marker: Path) -> bool:
        """Whether the artifact was published after `marker` was written."""
        manifest = self.folder / mf.MANIFEST
        return manifest.is_file() and manifest.stat().st_mtime_ns > marker.stat().st_mtime_ns

    def parent(self, name: str) -> Path:
        """The folder of parent stage `name` (verified against its manifest before the build started)."""
        if name not in self.folders:
            raise mf.ArtifactError(f"{name} is not a declared parent (declared: {sorted(self.folders)})")
        return self.folders[name]


@dataclass
class Built:
    """What a build body hands back: `write(folder)` fills the artifact folder (None: the build wrote its files
    into `Inputs.fresh_work()`, which becomes the artifact as it is); `size_of` names the file whose size is
    recorded as `size_bytes`; `line` is the stage's summary (a string, or made from the manifest); `parents` the
    artifacts of the run beyond the declared parents that the build chose to read (the labeller bundle that
    labelled the transfer set), recorded with them so that building one again makes this artifact stale, without
    entering its config hash."""

    write: Callable[[Path], None] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    line: str | Callable[[mf.Manifest], str] = ""
    size_of: str | None = None
    parents: dict[str, mf.Parent] = field(default_factory=dict)


@dataclass(frozen=True)
class Artifact:
    """A finished artifact named by its folder (a bundle given on the command line, one a report reads), as a
    parent: its manifest's hash stands in for a config hash, so rebuilding it makes its children stale."""

    name: str
    folder: Path

    @property
    def config_hash(self) -> str:
        manifest = self.folder / mf.MANIFEST
        return mf.sha256_file(manifest) if manifest.is_file() else "missing"


WALL = ".wall_seconds"  # in a stage's work folder: the wall time of its runs that stopped before publishing


def _take_earlier(work: Path, work_key: str, watch: mf.Stopwatch) -> None:
    """Add to `watch` the wall time that the runs stopped before this one kept in `work` for the work of `work_key`
    (`Inputs.work_key`) and remove that record, read once the build has run: none where the build emptied the folder
    (a forced run starting over), for other work (a parent built again), or in a file this code did not write."""
    try:
        kept = json.loads((work / WALL).read_text())
        watch.earlier += max(0.0, float(kept["seconds"])) if kept["work_key"] == work_key else 0.0
    except (OSError, ValueError, TypeError, KeyError):
        pass
    (work / WALL).unlink(missing_ok=True)


@contextlib.contextmanager
def _wall_kept(inputs: Inputs, watch: mf.Stopwatch):
    """Where the build stops (Ctrl-C, SIGTERM, an error) and leaves its work folder to resume, keep its wall time so
    far there, with that of the runs before it whose work it went on with: the run that publishes adds it, so that
    `wall_seconds` is the build's over its runs (those a SIGKILL, or the out-of-memory killer, ended left out). The
    record is kept where it can be: one that cannot be written (a full device) is lost, not raised over the error
    that stopped the build."""
    try:
        yield
    except BaseException:
        if inputs.work.is_dir() and main_rank():
            with contextlib.suppress(OSError):
                _take_earlier(inputs.work, inputs.work_key, watch)
                atomic_write(inputs.work / WALL, json.dumps({"work_key": inputs.work_key, "seconds": watch.seconds}))
        raise


@contextlib.contextmanager
def _removed_if_failed(inputs: Inputs):
    """Remove the scratch folder `fresh_work` gave where the block fails: nothing in it resumes, and a bundle's can
    hold several copies of a model."""
    try:
        yield
    except BaseException:
        for work in inputs.throwaway:
            shutil.rmtree(work, ignore_errors=True)
        raise


def body(module: str, **kwargs) -> Callable[[Inputs], Built | None]:
    """The build body `build_stage(inputs, **kwargs)` of `module` (a dotted name), imported only once the stage
    builds: a stage is declared, and found current, without importing what building it takes (torch, transformers,
    ONNX), which loads for seconds."""

    def build(inputs: Inputs) -> Built | None:
        return importlib.import_module(module).build_stage(inputs, **kwargs)

    return build


@dataclass(frozen=True)
class Stage:
    """One stage of a recipe: `build(inputs) -> Built`, or None on a worker rank of a distributed run."""

    name: str
    recipe: Recipe
    settings: tuple[str, ...]
    build: Callable[[Inputs], Built | None]
    parents: tuple["Stage | Artifact", ...] = ()
    extra: Any = None
    """Further JSON-able choices of this stage alone (one student's spec without a field, a texts file given on
    the command line), hashed too; local files named in it count by their contents."""
    also_stale: Callable[[Path], str | None] | None = None
    """Why the artifact in a folder must be built again though its settings and parents are the recipe's (a transfer
    set of an earlier release whose labeller bundle is not among its parents, a TensorRT engine built for another
    TensorRT or GPU); None when it need not. Not hashed."""
    unread: tuple[str, ...] = ()
    """Settings an earlier release hashed for this stage that it does not read (a bundle's gates of other
    precisions): an artifact whose record differs only by them is current. Not hashed."""
    preflight: Callable[[], None] | None = None
    """Raises where this machine cannot build the stage (a bundle for a GPU or TensorRT it lacks): run once the stage
    is found stale, before its parents are read, whose errors would send the user to build them first. Not hashed."""

    @property
    def folder(self) -> Path:
        return run_dir(self.recipe) / self.name

    @property
    def work(self) -> Path:
        """Scratch space that survives a killed run (checkpoints, label shards, a measurement's logs); removed
        once published."""
        return run_dir(self.recipe) / ".work" / self.name

    @cached_property
    def hashed(self) -> dict[str, Any]:
        """What `config_hash` covers: the declared settings, `extra` (local files by their contents), the parent
        stages' config hashes and the parent artifacts' manifest hashes; recorded in the manifest, to say which
        of them changed."""
        extra = self._extra_by_content
        return {
            "settings": self.recipe.settings(*self.settings),
            "extra": extra if isinstance(extra, dict) else {"extra": extra},
            "parents": {p.name: p.config_hash for p in self.parents if isinstance(p, Stage)},
            "artifacts": {p.name: p.config_hash for p in self.parents if isinstance(p, Artifact)},
        }

    @cached_property
    def _extra_by_content(self):
        """`extra` with its local files as their digests: read once for `hashed` and `config_hash`."""
        return by_content(self.extra)

    @cached_property
    def config_hash(self) -> str:
        own = {"settings": self.hashed["settings"], "extra": self._extra_by_content}
        upstream = self.hashed["parents"] | self.hashed["artifacts"]
        return hashlib.sha256(json.dumps([own, upstream], sort_keys=True).encode()).hexdigest()[:16]

    def staleness(self) -> str | None:
        """Why the artifact must be built again (`manifest.staleness`, then `also_stale`, then a parent stage out of
        date: `manifest.parent_out_of_date`), or None when it is current."""
        why = mf.staleness(self.folder, self.config_hash, self.parent_folders, self.hashed, self.unread)
        if why is None and self.also_stale is not None:
            why = self.also_stale(self.folder)
        return why or mf.parent_out_of_date({p.name: p.folder for p in self.parents if isinstance(p, Stage)})

    def built(self, manifest: mf.Manifest) -> bool:
        """Whether `manifest`'s artifact was built from this stage's settings and parents (`manifest.same_config`)."""
        return mf.same_config(manifest, self.config_hash, self.hashed, self.unread)

    def is_current(self) -> bool:
        """A finished artifact built from the same settings (parents' hashes included), from parents unchanged since."""
        return self.staleness() is None

    def gone(self) -> list[str]:
        """`key: path` of each file or folder that this stage's settings, or a parent stage's, name and that does not
        exist (`common.manifest.gone`)."""
        parents = [path for parent in self.parents if isinstance(parent, Stage) for path in parent.gone()]
        return mf.gone_paths(self.hashed["settings"]) + parents

    @property
    def parent_folders(self) -> dict[str, Path]:
        """Each parent's folder as it is now: where staleness and the build look for it."""
        return {parent.name: parent.folder for parent in self.parents}

    def inputs(self, force: bool = False) -> Inputs:
        """Load and verify every parent; a missing or altered one, one built from other settings than this recipe's,
        or one out of date (`manifest.out_of_date`), raises `ArtifactError` naming it and the way out."""
        manifests = {}
        for parent in self.parents:
            built = (parent.folder / mf.MANIFEST).is_file()  # else the error says to run its stage first
            try:
                manifests[parent.name] = mf.load(parent.folder)
            except mf.ArtifactError as err:
                again = mf.how_to_build(parent.folder, again=True)
                raise mf.ArtifactError(f"{err}; {again}" if built else str(err)) from None
        for parent in self.parents:
            # a parent built from other settings than this recipe's: the child would be built on it (a teacher of
            # other labels labelling the transfer set) while recording the recipe's, and be current
            built_from = manifests[parent.name]
            if isinstance(parent, Stage) and not parent.built(built_from):
                if missing := parent.gone():  # not another setting: a file to read it from is not there
                    raise mf.ArtifactError(
                        f"[{self.name}] whether its parent {parent.folder} is of the recipe cannot be told: "
                        f"{missing[0]} not found; {mf.GONE_ADVICE}"
                    )
                why = mf.changes(built_from.hashed, parent.hashed) if built_from.hashed else "its settings changed"
                raise mf.ArtifactError(
                    f"[{self.name}] its parent {parent.folder} was built from other settings ({why}); "
                    f"{mf.how_to_build(parent.folder)} first, or `edgedistill all RECIPE`, which builds every stage "
                    "in order"
                )
            # a parent of the recipe's settings built on an older artifact (a student of the transfer set before it
            # was built again): the child would be built on it and be current
            if isinstance(parent, Stage) and (why := mf.out_of_date(parent.folder)):
                raise mf.ArtifactError(
                    f"[{self.name}] its parent {parent.folder} is out of date ({why}); "
                    f"{mf.how_to_build(parent.folder)} first, or `edgedistill all RECIPE`, which builds every stage "
                    "in order"
                )
        # each parent by its files' digests, not its manifest's bytes, which hold when it was built
        parents = {
            name: {file: entry.sha256 for file, entry in built.files.items()} for name, built in manifests.items()
        }
        key = hashlib.sha256(json.dumps([self.config_hash, parents], sort_keys=True).encode()).hexdigest()[:16]
        return Inputs(self.recipe, self.config_hash, self.work, force, manifests, self.parent_folders, key, self.folder)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The stage's lock (`common.locks`): one process at a time checks and builds it. Once it is held, what a
        publish killed half-way left is put back, even where nothing is built now, and before any process (under
        torchrun any rank, `distill.dist.run_stage`) decides whether to build. A work folder holding a manifest is
        removed: an artifact published from it (`Built.write` None), or the one it replaced, by a run killed before
        it removed the folder; no build resumes from one."""
        with locks.exclusive(self.work.with_name(f"{self.name}.lock"), self.name):
            remove_orphans(self.folder, locked=True)
            if (self.work / mf.MANIFEST).is_file():
                shutil.rmtree(self.work, ignore_errors=True)
            yield

    def run(self, force: bool = False) -> mf.Manifest | None:
        """Skip when current (unless `force`), else build and publish (saying why an existing artifact is built
        again), holding the stage's lock; None on a worker rank. Under torchrun rank 0 holds the lock for all ranks
        (`distill.dist.run_stage` lets every rank decide only once it does)."""
        self.parents_built()
        with self.lock() if main_rank() else contextlib.nullcontext():
            return self.run_locked(force)

    def parents_built(self) -> None:
        """Raise `inputs`' error for a parent artifact given by its folder (a command's `--bundle`) with no manifest,
        before the lock is taken: a stage named after a misspelt folder leaves no lock file under that name. A missing
        parent stage is named once the lock is held, with why the child would be built again."""
        for parent in self.parents:
            if isinstance(parent, Artifact) and not (parent.folder / mf.MANIFEST).is_file():
                mf.load(parent.folder)

    def skip(self) -> bool:
        """`run` where the artifact is current: say so and return True, holding the stage's lock; False, building
        nothing, where it is not."""
        with self.lock():
            if self.staleness() is not None:
                return False
            self._say_current()
            return True

    def run_locked(self, force: bool = False) -> mf.Manifest | None:
        """`run` for a caller that holds the stage's lock (or whose rank 0 does)."""
        stale = "--force" if force else self.staleness()
        if stale is None:
            if main_rank():  # every rank decides alike; one says so
                self._say_current()
            return mf.load(self.folder, verify=False)
        if self.folder.is_symlink():  # before the build, which may take hours, fails only where it publishes
            raise mf.ArtifactError(
                f"{self.folder} is a link (to {os.readlink(self.folder)}), and building {self.name} again ({stale}) "
                "puts a new folder in its place: link the run folder or the runs folder instead, or put the folder "
                "itself there"
            )
        if (self.folder / mf.MANIFEST).is_file() and main_rank():
            progress.write(f"[{self.name}] building again: {stale}")
        watch = mf.Stopwatch()
        if self.preflight is not None:
            self.preflight()
        inputs = self.inputs(force)
        parents = {name: mf.parent_of(folder) for name, folder in inputs.folders.items()}
        # training curves go to the tracker during the build
        with (
            tracking.stage_run(self.recipe, self.name, self.config_hash) as tracker,
            _removed_if_failed(inputs),
            _wall_kept(inputs, watch),
        ):
            built = self.build(inputs)
            if built is None:
                return None
            _take_earlier(self.work, inputs.work_key, watch)  # before the work folder may become the artifact
            if built.write is None:
                manifest = self._publish(self.work, built, watch, parents)
            else:
                with mf.stage_folder(self.folder) as tmp:
                    built.write(tmp)
                    manifest = self._publish(tmp, built, watch, parents)
            shutil.rmtree(self.work, ignore_errors=True)  # at once: a failure from here on leaves no work to resume
            tracker.log_final(manifest.metrics)  # `tracking.Guarded`: a failure warns, and fails no published stage
        modelcard.write(self.recipe, self.folder)  # a model's card, derived from the published manifest
        line = built.line(manifest) if callable(built.line) else built.line
        progress.write(f"[{self.name}] {line}, wall {watch.seconds / 60:.1f} min -> {self.folder}")
        return manifest

    def _say_current(self) -> None:
        """Say the artifact is current, and write the model card that a run stopped between publishing it and writing
        the card (killed) left missing: the manifest does not hash the card, so the artifact is current without it."""
        if not (self.folder / mf.CARD).is_file():
            modelcard.write(self.recipe, self.folder)
        progress.write(f"[{self.name}] up to date: {self.folder}")

    def _publish(self, tmp: Path, built: Built, watch: mf.Stopwatch, parents: dict[str, mf.Parent]) -> mf.Manifest:
        measured = {"size_bytes": (tmp / built.size_of).stat().st_size} if built.size_of else {}
        manifest = mf.for_stage(
            self.recipe,
            self.name,
            self.config_hash,
            watch,
            metrics=built.metrics | measured,
            parents=parents | built.parents,
            hashed=self.hashed,
            info=built.info,
        )
        return mf.commit(tmp, self.folder, manifest)


def skip_all(stages: list[Stage]) -> bool:
    """Whether every one of a command's `stages` is current, each then said so (`Stage.skip`): such a command
    answers without setting up training or export. False where one is not (nothing said), or under `torchrun`,
    whose ranks decide together (`distill.dist.run_stage`)."""
    if os.environ.get("WORLD_SIZE", "1") != "1":
        return False
    return all(stage.is_current() for stage in stages) and all(stage.skip() for stage in stages)
