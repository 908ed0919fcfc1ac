"""The folders of a run's measurements of a served bundle: one per bundle, `<measurement>-<bundle id>`.

Measuring a second bundle keeps the first's result, and the report and the headline find the deployed bundle's by
`export.deploy`. The measurements (`bench`, `loadtests`) and the report name their folders here, so the report reads
them without importing the server.
"""

from pathlib import Path
from typing import get_args

from edgedistill.common import manifest as mf
from edgedistill.common.config.measure import Profile
from edgedistill.common.manifest import ArtifactError

SERVING = "serve-bench"  # `bench serving`
ACCURACY = "serve-accuracy"  # `bench accuracy`
PEERS = "serve-peers"  # `bench peers`
SCALING = "serve-scaling"  # `bench scaling`
CASCADE = "serve-cascade"  # `bench cascade`: one folder per cascade, by its name
BUNDLE = "bundle"  # the parent a measurement records the bundle it measured as


def bundle_id(bundle_folder: Path) -> str:
    """The id of the bundle (or cascade) in `bundle_folder`: `<id>` for `bundle-<id>`, else the folder's name."""
    return bundle_folder.name.removeprefix("bundle-")


def folder_name(measurement: str, bundle: str) -> str:
    """`<measurement>-<bundle>`: the result folder of `measurement` (SERVING, ..., CASCADE, or `loadtest(profile)`) on
    the bundle (or cascade) whose id is `bundle`."""
    return f"{measurement}-{bundle}"


def of_bundle(measurement: str, bundle_folder: Path, run: Path) -> str:
    """The result folder of `measurement` on the bundle (or cascade) in `bundle_folder`, in the run folder `run`;
    `ArtifactError` where `run` has a bundle of that id of its own elsewhere than `bundle_folder`, whose result the
    folder holds (the report would show the other bundle's as this run's)."""
    name = bundle_id(bundle_folder)
    own = run / f"bundle-{name}"
    if own.exists() and own.resolve() != bundle_folder.resolve():
        raise ArtifactError(
            f"{bundle_folder}: {run} has a bundle of that name of its own, {own}, whose {measurement} result "
            f"{folder_name(measurement, name)}/ holds: measure {own}, or copy {bundle_folder} under another name"
        )
    return folder_name(measurement, name)


def loadtest(profile: str) -> str:
    """The measurement a load test of `profile` is: `loadtest-<profile>`, whose folders are one per bundle."""
    return f"loadtest-{profile}"


def echo_loadtest(profile: str) -> str:
    """The folder of a load test of `profile` against the echo server: one, whatever bundle gave its texts."""
    return f"{loadtest(profile)}-echo"


# Each measurement of a bundle; also the folder names of releases that kept one result whatever bundle was measured
# (which bundle they hold, the name does not say).
MEASUREMENTS = (SERVING, ACCURACY, PEERS, SCALING, *(loadtest(profile) for profile in get_args(Profile)))


def stale(result: Path, bundle_folder: Path) -> str | None:
    """Why the finished measurement in `result` is not of the bundle now in `bundle_folder`: that bundle was built
    again since it ran, or is gone (`common.manifest.parent_change`); None when it is."""
    return mf.parent_change(mf.load(result, verify=False), {BUNDLE: bundle_folder})
