"""`python -m loadtests RECIPE --profile NAME [--bundle PATH] [--texts FILE | --pairs FILE [--header] [--columns TEXT
PAIR]] [--echo] [--force] [--section.key=value ...]`.

Profiles (settings in the recipe's `loadtest` section): smoke, steady, step, spike, soak. The result is
`runs/<recipe>/loadtest-<profile>-<id>/` for `--bundle runs/<recipe>/bundle-<id>`, one per bundle. `--echo`
runs the profile against the do-nothing echo server: what gRPC and locust alone cost on this machine. A pairs file
is read as `edgedistill call --tsv` reads one (`bench.texts.PairsFile`).
A run whose settings, bundle, texts and server settings (`EDGEDISTILL_*`) are unchanged is not repeated without
`--force`.
Exit status: 0 when every SLO check passed, 1 when one was missed (each named on stderr, with the failed calls by
gRPC status), 2 when the run could not be made.
"""

import sys
from pathlib import Path

from edgedistill.bench import BUNDLE_HELP, BenchError, slo
from edgedistill.bench.texts import PairsFile, add_texts_arguments
from edgedistill.common import sections
from edgedistill.common.arguments import ArgumentParser
from edgedistill.common.manifest import ArtifactError
from edgedistill.common.recipe import add_recipe_argument, load_command_recipe, parse_overrides
from edgedistill.common.scenarios import SCENARIOS_VAR, scenario_weights


def main(argv: list[str] | None = None, prog: str = "python -m loadtests") -> int:
    parser = ArgumentParser(prog=prog, description="Load-test a served bundle with locust.")
    add_recipe_argument(parser, "loadtest")
    parser.add_argument(
        "--profile",
        choices=sections.PROFILES,
        default=sections.DEFAULT_PROFILE,
        metavar=sections.PROFILE,
        help=f"load profile: {', '.join(sections.PROFILES)} (default {sections.DEFAULT_PROFILE})",
    )
    parser.add_argument("--bundle", type=Path, help=BUNDLE_HELP)
    add_texts_arguments(parser)
    parser.add_argument(
        "--scenarios", help=f"scenario weights, e.g. single=3,batch=1 (default: ${SCENARIOS_VAR}, else the recipe's)"
    )
    parser.add_argument(
        "--echo",
        action="store_true",
        help="load the do-nothing echo server instead (loadtest-PROFILE-echo): the floor of gRPC and locust here",
    )
    parser.add_argument("--force", action="store_true", help="run again even if up to date")
    args, rest = parser.parse_known_args(argv)
    # grpc and locust: here, not at the top, so that run_module names the extra of a missing one
    from edgedistill.bench.serving import bundle_to_serve
    from edgedistill.loadtests import result as rs
    from edgedistill.loadtests import runner

    try:
        pairs_file = PairsFile.of(args)
        overrides = parse_overrides(rest)
        scenarios = scenario_weights(overrides, args.profile, args.scenarios)
        command = sections.loadtest(args.profile)
        recipe = load_command_recipe(args.recipe, overrides, command, f"{prog} --profile {args.profile}")
        bundle = bundle_to_serve(recipe, args.bundle)
        stage = runner.stage(recipe, args.profile, bundle, args.texts, scenarios, echo=args.echo, pairs_file=pairs_file)
        stage.run(args.force)
        result = rs.load(stage.folder)
    except (ValueError, ArtifactError, BenchError, runner.LoadtestError) as err:  # ValueError: recipe, settings
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    missed = [check for check in result["checks"] if not check["passed"]]
    for check in missed:
        print(f"SLO missed: {slo.describe(check)}", file=sys.stderr)
    if failures := rs.failures_line(result["overall"]):  # within the SLO's error rate too
        print(failures, file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    from edgedistill.cli import run_module

    # as it was run: `loadtests` in a checkout, `edgedistill.loadtests`
    run_module(main, f"python -m {__spec__.parent}", "loadtest")
