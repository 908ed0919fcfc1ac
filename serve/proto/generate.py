"""Regenerate the committed `*_pb2.py` / `*_pb2_grpc.py` from the `.proto` files beside this script.

`python -m serve.proto.generate [--out DIR]`. protoc writes absolute imports (`import kserve_pb2`);
they are rewritten to package-relative ones so the modules import as `serve.proto.*`.
"""

import re
from importlib import resources
from pathlib import Path

from edgedistill.common.arguments import ArgumentParser, output_folder

HERE = Path(__file__).resolve().parent
PROTOS = ("classifier.proto", "kserve.proto")
_ABSOLUTE_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


class ProtocError(RuntimeError):
    """protoc failed on one of the protos."""


def generated_names(proto: str) -> tuple[str, str]:
    stem = Path(proto).stem
    return f"{stem}_pb2.py", f"{stem}_pb2_grpc.py"


def _relative_imports(source: str) -> str:
    return _ABSOLUTE_IMPORT.sub(r"from . import \1 as \2", source)


def generate(out: Path = HERE) -> list[Path]:
    """Run protoc on every proto into `out`, fix the imports, and return the files written."""
    from grpc_tools import protoc

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={HERE}",
        f"--proto_path={well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise ProtocError(f"protoc failed on {', '.join(PROTOS)} (its message is above)")
    written = []
    for proto in PROTOS:
        for name in generated_names(proto):
            path = out / name
            path.write_text(_relative_imports(path.read_text(encoding="utf-8")), encoding="utf-8")
            written.append(path)
    return written


def main(argv: list[str] | None = None, prog: str = "python -m serve.proto.generate") -> int:
    parser = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_folder, default=HERE, help="output folder (default: beside the protos)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":  # its usage names the module as it was run: `edgedistill.` first when installed
    from edgedistill.cli import run_module

    run_module(main, f"python -m {__spec__.name}", "proto")
