"""`edgedistill call`: classify texts with a running server and print JSON.

edgedistill call "a great movie" "a dull one"
EDGEDISTILL_TOKEN=... edgedistill call --file reviews.txt --file more.txt --address host:50051 --tls-ca ca.pem
edgedistill call "the plot" --pair "a dull one"      # a text pair, for models trained on pairs
edgedistill call --tsv dev.tsv --header              # pairs: text<TAB>pair on each line
echo "a great movie" | edgedistill call --kserve

The texts go in calls of `--batch-size` texts and at most `--batch-bytes` each (default: as many texts as the server
takes, its MAX_TEXTS, and half its MAX_MESSAGE_BYTES, asked of it), and one JSON document is written, its
predictions as they come.
"""

import argparse
import json
import os
import re
import ssl
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import grpc
from edgedistill.common.arguments import ArgumentParser, count, input_file
from edgedistill.common.settings import ENV_PREFIX
from edgedistill.serve.client import (
    DEFAULT_ADDRESS,
    MAX_ATTEMPTS,
    TIMEOUT,
    Client,
    LabelsUnavailable,
    classify_request,
    kserve_request,
    timeout_problem,
    token_problem,
    uses_tls,
)
from edgedistill.serve.settings import TARGET_SCHEMES, Settings, blank
from edgedistill.serve.textfiles import Origins, UsageError, add_columns_arguments, read_texts
from edgedistill.serve.tls import TLS_FILES

# The CLI's token without --token (whose value every user of the machine sees in `ps`): the server's own variables
TOKEN_VAR, ADMIN_TOKEN_VAR = ENV_PREFIX + "TOKEN", ENV_PREFIX + "ADMIN_TOKEN"
# For a server that does not say its limit: its default MAX_TEXTS
MAX_TEXTS = Settings.model_fields["max_texts"].default
# what a text costs in a call beyond its UTF-8 bytes: a field tag and length (Classify), a 4-byte length (KServe's
# raw contents); short texts add more in these than in text
WIRE_BYTES = 8
# For a server that does not say its limit: half its default MAX_MESSAGE_BYTES
BATCH_BYTES = Settings.model_fields["max_message_bytes"].default // 2
# A Reload's deadline unless --timeout gives one: loading and warming up a model (a TensorRT engine) can take minutes
RELOAD_TIMEOUT = 600.0
# How to learn how a reload ended that its call did not wait for
RELOAD_OUTCOME = (
    "`edgedistill call --info` says which model serves, the server's log (model_active or reload_failed) how the "
    "reload ended"
)
# Where a Reload's deadline passed: the server goes on with the reload all the same
RELOAD_GOES_ON = (
    f"the server goes on with the reload past the call's deadline: {RELOAD_OUTCOME}; give a longer --timeout to wait "
    "for it"
)
# Where a Reload was cut (UNAVAILABLE: a connection's max age, a drain): it is not sent again, as the server may be
# loading the bundle all the same
RELOAD_CUT = f"the call was cut, and is not sent again: the server may go on with the reload; {RELOAD_OUTCOME}"
RELOAD_HINTS = {grpc.StatusCode.DEADLINE_EXCEEDED: RELOAD_GOES_ON, grpc.StatusCode.UNAVAILABLE: RELOAD_CUT}
# How the server names a text or pair it refuses: "text" or "text pair", and its place in the call, counted from 0
SERVER_NAMED_TEXT = re.compile(r"(text(?: pair)?) (\d+) ")


class ModelChanged(RuntimeError):
    """The served model changed between the batches of one run (a reload): its predictions would mix models."""


class CallFailed(Exception):
    """A call of a run in batches failed with `error`: `where` names its texts in the input (`classify_in_batches`)."""

    def __init__(self, error: grpc.RpcError, where: str):
        super().__init__(where)
        self.error, self.where = error, where


def batches(texts: list[str], pairs: list[str] | None, batch_size: int, batch_bytes: int) -> Iterator[slice]:
    """Consecutive slices of at most `batch_size` texts whose bytes on the wire (UTF-8 and WIRE_BYTES each, their
    pairs' included) add up to at most `batch_bytes`; a text longer than that on its own is a batch of one, for the
    server to take or refuse."""
    start, size = 0, 0
    for i, text in enumerate(texts):
        length = WIRE_BYTES + len(text.encode()) + (0 if pairs is None else WIRE_BYTES + len(pairs[i].encode()))
        if i > start and (i - start == batch_size or size + length > batch_bytes):
            yield slice(start, i)
            start, size = i, 0
        size += length
    if texts:
        yield slice(start, len(texts))


def call_overhead(kserve: bool, pairs: bool, model: str) -> int:
    """The bytes a call's request takes beyond its texts' (UTF-8 and WIRE_BYTES each): the request of no texts, with
    the model's name and, through KServe (`kserve`), the headers of its input tensors, one per text input."""
    request = kserve_request if kserve else classify_request
    return request([], [] if pairs else None, model).ByteSize()


def classify_in_batches(
    infer,
    texts: list[str],
    pairs: list[str] | None,
    batch_size: int,
    model: str = "",
    batch_bytes: int = BATCH_BYTES,
    origins: Origins | None = None,
) -> Iterator[dict]:
    """`infer` (`Client.classify` or `Client.kserve_infer`) on consecutive `batches`; each reply in order;
    `ModelChanged` when the served model changes between batches; `CallFailed` for a call that fails, naming where
    its texts are by their `origins` (default: 'text N' and 'text pair N', counted from 1)."""
    numbers = range(1, len(texts) + 1)
    origins = origins or {kind: [f"{kind} {number}" for number in numbers] for kind in ("text", "text pair")}
    first = None
    for batch in batches(texts, pairs, batch_size, batch_bytes):
        start = batch.start
        try:
            result = infer(texts[batch], None if pairs is None else pairs[batch], model=model)
        except grpc.RpcError as err:
            raise CallFailed(err, _where(err, {kind: places[batch] for kind, places in origins.items()})) from err
        served = (result["model"], result["version"])
        if first is not None and served != first:
            raise ModelChanged(
                f"the server switched from model {first[0]} version {first[1]} to {served[0]} version {served[1]} "
                f"after {start} texts: classify the texts again"
            )
        first = served
        yield result


def _where(error: grpc.RpcError, origins: Origins) -> str:
    """Where the texts of a call that failed with `error` are: the text or pair the server refused where it names it
    (as 'text 5' or 'text pair 5', counted from 0 in the call), else the call's first and last texts."""
    named = SERVER_NAMED_TEXT.match(error.details() or "")
    if error.code() == grpc.StatusCode.INVALID_ARGUMENT and named and int(named[2]) < len(origins[named[1]]):
        return origins[named[1]][int(named[2])]
    texts = origins["text"]
    return texts[0] if len(texts) == 1 else f"{texts[0]} to {texts[-1]}"


def write_streamed(results: Iterator[dict], out: TextIO) -> None:
    """One JSON document {"model", "version", "predictions": [...]}, each prediction written (one a line) as its
    batch arrives. Where `results` raise after the first batch (a refused call, a reload, Ctrl-C), the document is
    still closed, holding the predictions so far and `"complete": false`, and the error goes on."""
    separator, complete = None, False  # None: the head is not written yet
    try:
        for result in results:
            if separator is None:
                head = json.dumps({"model": result["model"], "version": result["version"]})
                out.write(head[:-1] + ', "predictions": [\n')
                separator = "  "
            for prediction in result["predictions"]:
                out.write(separator + json.dumps(prediction))
                separator = ",\n  "
            out.flush()
        complete = True
    finally:
        if separator is not None:
            out.write("\n]" + ("}" if complete else ', "complete": false}') + "\n")
            out.flush()


def _utf8(value: str) -> str:
    """An argument that is UTF-8: Python passes bytes that are not on as lone surrogates, which no message can carry."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise argparse.ArgumentTypeError(f"not UTF-8 ({err.reason} at position {err.start})") from None
    return value


def _token(value: str) -> str:
    """A token to send (`token_problem`)."""
    if problem := token_problem(value):
        raise argparse.ArgumentTypeError(f"{problem}: drop --token to send none" if blank(value) else problem)
    return value


# `host:port` or `[v6]:port`, where the rest is no gRPC target of a scheme (`dns:`, `unix:` and the others)
HOST_PATTERN = r"\[[^\]]*\]|[^:\[\]]+"  # a name or IPv4 address, or an IPv6 one in brackets
HOST_PORT = re.compile(rf"(?!(?:{'|'.join(TARGET_SCHEMES)}):)({HOST_PATTERN}):([^:]*)")
HOST = re.compile(HOST_PATTERN)  # a host alone, which gRPC would dial on port 443
# two colons or more, no brackets and no scheme: an IPv6 address, where gRPC cannot tell a port from its last group
BARE_IPV6 = re.compile(rf"(?!(?:{'|'.join(TARGET_SCHEMES)}):)[^\[\]]*:[^\[\]]*:[^\[\]]*")


URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # a URL's scheme (`http://`), which names no gRPC target
DNS_HOST = re.compile(rf"dns:(?://[^/]*/)?({HOST_PATTERN})")  # a `dns:` target of a host alone, dialled on 443


def _address(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must name the server, host:port")
    if URL.match(value) and not value.startswith(tuple(f"{scheme}:" for scheme in TARGET_SCHEMES)):
        raise argparse.ArgumentTypeError(
            f"{value} is a URL, not a gRPC target: give host:port, e.g. {DEFAULT_ADDRESS} (gRPC speaks HTTP/2 "
            "itself; TLS is --tls)"
        )
    if DNS_HOST.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value} names no port, and gRPC would dial 443: give {value}:port")
    if HOST.fullmatch(value):
        port = DEFAULT_ADDRESS.rsplit(":", 1)[1]
        raise argparse.ArgumentTypeError(
            f"{value} names no port, and gRPC would dial 443: give host:port, e.g. {value}:{port}, the server's default"
        )
    if BARE_IPV6.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value} reads as an IPv6 address without brackets, whose port gRPC cannot tell from the address: "
            f"give [address]:port, e.g. [::1]:{DEFAULT_ADDRESS.rsplit(':', 1)[1]}"
        )
    # gRPC takes a port past 65535 modulo 65536: another port, on which another server may answer (and digits of
    # other scripts, which `isdigit` takes, not at all)
    if (plain := HOST_PORT.fullmatch(value)) and not (
        plain[2].isascii() and plain[2].isdigit() and 0 < int(plain[2]) < 65536
    ):
        raise argparse.ArgumentTypeError(f"the port of {value} must be a number from 1 to 65535")
    return value


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {value!r}") from None
    if problem := timeout_problem(seconds):
        raise argparse.ArgumentTypeError(problem)
    return seconds


def build_parser(prog: str = "python -m serve.call") -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, description="Classify texts with an edgedistill server.")
    parser.add_argument(
        "texts", nargs="*", type=_utf8, help="texts to classify (default: --file, else one per line on stdin)"
    )
    parser.add_argument(
        "--file", type=input_file, action="append", help="a file with one text per line ('-': stdin); repeatable"
    )
    parser.add_argument(
        "--pair", action="append", type=_utf8, help="the second text of a pair, one per text in order; repeatable"
    )
    parser.add_argument(
        "--tsv",
        type=input_file,
        action="append",
        help="text pairs, text<TAB>pair on each line, or the --columns (no quoting; further fields ignored; '-': "
        "stdin); repeatable",
    )
    add_columns_arguments(parser, "each --tsv file")
    parser.add_argument(
        "--batch-size",
        type=count,
        metavar="N",
        help=f"texts per call, at most the server's MAX_TEXTS (default: that limit, asked of the server; {MAX_TEXTS} "
        "where it does not say)",
    )
    parser.add_argument(
        "--batch-bytes",
        type=count,
        metavar="N",
        help=f"bytes per call (each text's UTF-8 and {WIRE_BYTES}, and the request's other fields), below the server's "
        "MAX_MESSAGE_BYTES; a longer text goes alone (default: half "
        f"that limit, asked of the server; {BATCH_BYTES} where it does not say)",
    )
    parser.add_argument(
        "--address", default=DEFAULT_ADDRESS, type=_address, help=f"server host:port (default {DEFAULT_ADDRESS})"
    )
    parser.add_argument("--kserve", action="store_true", help="use the KServe v2 protocol (ModelInfer)")
    parser.add_argument("--model", default="", type=_utf8, help="model name (default: the served one)")
    parser.add_argument(
        "--token",
        type=_token,
        help=f"bearer token (default: ${TOKEN_VAR}, for --reload ${ADMIN_TOKEN_VAR}: a flag shows in `ps`)",
    )
    parser.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")
    parser.add_argument("--tls-ca", type=Path, help="CA certificate (PEM) to verify the server with; implies TLS")
    parser.add_argument("--tls-cert", type=Path, help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-key", type=Path, help="client private key (PEM) for mutual TLS")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        help=f"deadline per call in seconds (default {TIMEOUT:g}; for --reload {RELOAD_TIMEOUT:g}, as a model can take "
        "minutes to load and warm up)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=3,
        choices=range(MAX_ATTEMPTS),
        metavar="N",
        help=f"retries of a call refused with UNAVAILABLE or RESOURCE_EXHAUSTED, with backoff, 0-{MAX_ATTEMPTS - 1} "
        "(default 3)",
    )
    instead = parser.add_mutually_exclusive_group()  # each makes one call of its own, and sends no texts
    instead.add_argument("--info", action="store_true", help="print the served model's info instead")
    instead.add_argument(
        "--reload",
        nargs="?",
        const="",
        type=_utf8,
        metavar="BUNDLE",
        help="reload the served bundle, or load BUNDLE: a folder inside the server's RELOAD_ROOT, absolute or relative "
        "to that root",
    )
    return parser


# The options that only a classification uses, by their `argparse` destination: --info and --reload send no texts.
CLASSIFY_OPTIONS = {
    "texts": "text arguments",
    "file": "--file",
    "pair": "--pair",
    "tsv": "--tsv",
    "header": "--header",
    "columns": "--columns",
    "kserve": "--kserve",
    "batch_size": "--batch-size",
    "batch_bytes": "--batch-bytes",
}


def check_arguments(args: argparse.Namespace) -> None:
    """`UsageError` for options given where they would do nothing: those of a classification with --info or
    --reload, and --model with --reload (a Reload call names no model)."""
    command = "--info" if args.info else "--reload" if args.reload is not None else None
    if command is None:
        return
    if unused := [option for name, option in CLASSIFY_OPTIONS.items() if getattr(args, name)]:
        raise UsageError(f"{command} sends no texts: {', '.join(unused)} would do nothing with it; drop them")
    if command == "--reload" and args.model:
        raise UsageError("--reload names no model (it reloads the served bundle, or loads BUNDLE): drop --model")


def check_batches(batch_size: int | None, batch_bytes: int | None, max_texts: int | None, max_bytes: int | None):
    """`UsageError` for a --batch-size or --batch-bytes past the server's limits (None: it does not say), asked for
    the other: every call would be refused."""
    if batch_size and max_texts and batch_size > max_texts:
        raise UsageError(f"--batch-size {batch_size} is over the server's MAX_TEXTS, {max_texts}: give at most that")
    if batch_bytes and max_bytes and batch_bytes >= max_bytes:
        raise UsageError(
            f"--batch-bytes {batch_bytes} is not below the server's MAX_MESSAGE_BYTES, {max_bytes}: give less"
        )


def environ_token(reload: bool) -> str | None:
    """The token of the variable the server reads it from (ADMIN_TOKEN_VAR for a Reload, else TOKEN_VAR); None
    where unset. `UsageError` for one set but blank (`BLANK_TOKEN`), or one gRPC metadata cannot carry."""
    name = ADMIN_TOKEN_VAR if reload else TOKEN_VAR
    token = os.environ.get(name)
    if token is not None and (problem := token_problem(token)):
        fix = ": unset it to send no token, or set it to the server's token" if blank(token) else ""
        raise UsageError(f"{name} {problem}{fix}")
    return token


def _input_hint(client: Client, model: str, given_pairs: bool) -> str | None:
    """After a refused call, what to give the CLI where the texts were of the wrong shape for the served model
    (single texts for a model of pairs, or the reverse); None where they were not, or the server does not say."""
    try:
        takes_pairs = "text_pair" in client.model_info(model)["text_inputs"]
    except grpc.RpcError:
        return None
    if takes_pairs and not given_pairs:
        return "the served model takes text pairs: give --pair once per text, or --tsv FILE (text<TAB>pair lines)"
    if given_pairs and not takes_pairs:
        return "the served model takes single texts: give them as arguments or --file, without --pair or --tsv"
    return None


def _connection_hint(error: grpc.RpcError, address: str, tls: bool) -> str | None:
    """Where a call could not connect, what to give: a server where none listens, or the TLS options where client and
    server disagree on TLS (gRPC names neither)."""
    details = error.details() or ""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    if "Connection refused" in details:
        return (
            f"no server listens at {address}: start one (edgedistill serve --bundle BUNDLE), or give --address of one"
        )
    if not tls and "Socket closed" in details:
        return (
            "the server closed the connection at once, as a TLS server closes a plaintext one: if it serves TLS, give "
            "--tls-ca CA.pem (or --tls for a certificate this machine trusts)"
        )
    if tls and "WRONG_VERSION_NUMBER" in details:
        return "the server did not answer in TLS, as a plaintext server does not: if it serves plaintext, drop the --tls options"
    if tls and "Socket closed" in details:
        return (
            "the server closed the connection in the TLS handshake, as a server of mutual TLS does with a client that "
            "gives no certificate, or one its CA did not sign: give --tls-cert and --tls-key of a certificate it trusts"
        )
    if tls and "CERTIFICATE_VERIFY_FAILED" in details:
        return "the server's certificate is not one this client trusts: give --tls-ca the CA that signed it"
    return None


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`argv`'s arguments, intermixed (texts may follow options, as `TEXT --pair PAIR TEXT --pair PAIR` does), and
    the arguments after the first `--` texts whatever they start with (`-- -awful`): `parse_intermixed_args` does not
    honour `--` on Python 3.11, so they are parsed apart, as texts only."""
    argv = sys.argv[1:] if argv is None else argv
    end = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_intermixed_args(argv[:end])
    args.texts += parser.parse_args(argv[end:]).texts
    return args


def main(argv: list[str] | None = None, stdin=None, prog: str = "python -m serve.call") -> int:
    args = parse_arguments(build_parser(prog), argv)
    if sys.stdout is None:  # started with stdout closed (`>&-`): every answer would be lost
        print(f"{prog}: stdout is closed: nowhere to write the answers", file=sys.stderr)
        return 2
    try:
        check_arguments(args)
        token = args.token or environ_token(args.reload is not None)
    except UsageError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as warned:  # told as this command's own lines
            warnings.simplefilter("always")
            client = Client(
                args.address,
                token=token,
                tls=args.tls,
                tls_ca=args.tls_ca,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                timeout=args.timeout or (RELOAD_TIMEOUT if args.reload is not None else TIMEOUT),
                retries=args.retries,
            )
        for warning in warned:
            print(f"{prog}: warning: {warning.message}", file=sys.stderr)
    except ValueError as err:  # a client certificate without its key or the reverse (the CLI checks the rest first)
        usage = re.sub(r"\btls_(cert|key)\b", r"--tls-\1", str(err))  # its parameters named as this CLI's options
        print(f"{prog}: {usage}", file=sys.stderr)
        return 2
    except ssl.SSLError as err:  # read, but not PEM, or a key that is not the certificate's
        print(f"{prog}: cannot use --tls-ca, --tls-cert or --tls-key ({TLS_FILES}): {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a --tls-ca, --tls-cert or --tls-key that cannot be read
        print(f"{prog}: cannot read {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    hint = None  # what to give instead, where a call was refused for texts of the wrong shape
    where = None  # the texts of the call that failed, in the input
    try:
        with client:
            if args.info:
                print(json.dumps(client.model_info(args.model), indent=2), flush=True)
            elif args.reload is not None:
                print(json.dumps(client.reload(args.reload), indent=2), flush=True)
            else:
                texts, pairs, origins = read_texts(args, sys.stdin if stdin is None else stdin)
                infer = client.kserve_infer if args.kserve else client.classify
                batch_size, batch_bytes = args.batch_size, args.batch_bytes
                # A single text goes alone whatever they are; with both given, the server is not asked.
                if len(texts) > 1 and not (batch_size and batch_bytes):
                    max_texts, max_bytes = client.limits(args.model, args.kserve)
                    check_batches(batch_size, batch_bytes, max_texts, max_bytes)
                    batch_size = batch_size or max_texts
                    batch_bytes = batch_bytes or (max_bytes // 2 if max_bytes else None)
                text_bytes = (batch_bytes or BATCH_BYTES) - call_overhead(args.kserve, pairs is not None, args.model)
                results = classify_in_batches(
                    infer, texts, pairs, batch_size or MAX_TEXTS, args.model, text_bytes, origins
                )
                try:
                    write_streamed(results, sys.stdout)
                except CallFailed as failed:
                    where = failed.where
                    if failed.error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                        hint = _input_hint(client, args.model, pairs is not None)
                    raise failed.error from None
    except UsageError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except (ModelChanged, LabelsUnavailable) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except grpc.RpcError as err:
        hint = hint or _connection_hint(err, args.address, uses_tls(args.tls, args.tls_ca, args.tls_cert))
        if args.reload is not None:
            hint = hint or RELOAD_HINTS.get(err.code())
        error = {"code": err.code().name, "message": err.details()}
        error |= ({"where": where} if where else {}) | ({"hint": hint} if hint else {})
        print(json.dumps({"error": error}), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # its usage names the module as it was run: `edgedistill.` first when installed
    from edgedistill.cli import run_module

    run_module(main, f"python -m {__spec__.name}", "call")
