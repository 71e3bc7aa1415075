"""`txstream` command line: one verb per task (contract §4).

stdout carries only the summary of what was done; stderr the phases, the progress bar,
warnings and, on failure, one line (exit 2 for a usage or schema error, 1 for an engine
failure, with the path of the run's log where its full trace is).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import NoReturn

from txstream.cli.watchdog import watchdog
from txstream.cluster.ray_runtime import ray_address
from txstream.config import BUNDLED, KEY_TYPES, RunConfig
from txstream.connectors.extras import require_spark
from txstream.errors import RuntimeFailure, SchemaError, TxstreamError, UsageError
from txstream.monitor.logs import log_of, version

EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
ASK_TIMEOUT_S = 30.0
"""How long `query` and `status` may take in all (connecting to Ray included)."""
ANSWER_TIMEOUT_S = 20.0
"""How long they wait for the session's answer once connected."""
HELP_WIDTH = 100
"""Widest help text; narrower on a narrower terminal."""


class _HelpFormatter(argparse.HelpFormatter):
    """Help with every option's default (an option whose help already says what it
    defaults to, a flag or a required option has none added)."""

    def __init__(self, prog: str) -> None:
        width = min(HELP_WIDTH, shutil.get_terminal_size().columns - 2)
        super().__init__(prog, width=width, max_help_position=30)

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if (
            action.option_strings
            and not action.required
            and action.nargs != 0
            and "default" not in help
            and action.default is not None
        ):
            help += " (default: %(default)s)"
        return help


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line (``txstream run: error: argument --explore:
    invalid choice: ...``), exit 2, as every other usage error; ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"txstream: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="txstream",
        description="Transactional stream processing on Ray.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"txstream {version()}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=_Parser)

    gen = verbs.add_parser(
        "generate",
        help="write a synthetic workload (events + init state)",
        description="Write DIR/events.parquet and DIR/init/<table>.parquet: a workload with "
        "MorphStream's knobs (Table 5).",
        formatter_class=_HelpFormatter,
    )
    gen.add_argument("topology", choices=BUNDLED, help="benchmark topology")
    gen.add_argument("--out", required=True, metavar="DIR", help="folder to write (required)")
    gen.add_argument("--events", type=int, default=1_000_000, metavar="N", help="events")
    gen.add_argument("--keys", type=int, default=10_000, metavar="K", help="keys per table")
    gen.add_argument("--theta", type=float, default=0.2, metavar="T", help="Zipf skew of keys")
    gen.add_argument(
        "--abort-ratio",
        type=float,
        default=0.01,
        metavar="A",
        help="share of all events planted to abort",
    )
    gen.add_argument(
        "--txn-length",
        type=int,
        default=None,
        metavar="L",
        help="keys per GS event, items per OB alter/top (default: 1 for GS, 20 for OB; "
        "SL and TP have fixed shapes)",
    )
    gen.add_argument(
        "--deps",
        type=int,
        default=None,
        metavar="R",
        help="keys each GS write reads (default: 2)",
    )
    gen.add_argument("--seed", type=int, default=0, metavar="S", help="random seed")
    gen.add_argument(
        "--key-type",
        choices=KEY_TYPES,
        default="dense",
        metavar="TYPE",
        help="sl: dense keys 0..K-1, sparse random int64 ids or string ids acct-0000001, "
        "asset-0000001 (dense, int64, string)",
    )
    gen.add_argument(
        "--new-keys",
        type=float,
        default=0.0,
        metavar="F",
        help="sl on int64 or string keys: share of events that open an account or asset "
        "not in the init state",
    )

    run = verbs.add_parser(
        "run",
        help="run a topology over events",
        description="Run a topology over EVENTS from the init state; write events.parquet, "
        "state/<table>.parquet and metrics.json to the output folder, the run's log to "
        "its _logs/txstream.log.",
        formatter_class=_HelpFormatter,
    )
    run.add_argument(
        "topology",
        metavar="TOPOLOGY",
        help=f"a bundled topology ({', '.join(BUNDLED)}) or module:function returning one",
    )
    run.add_argument(
        "--input",
        required=True,
        metavar="EVENTS",
        help="Parquet file, or folder of them in name order (required)",
    )
    run.add_argument(
        "--init-state",
        required=True,
        metavar="DIR",
        help="folder of <table>.parquet (required)",
    )
    run.add_argument("--output", required=True, metavar="DIR", help="folder to write (required)")
    _add_config_options(run)
    run.add_argument(
        "--follow",
        action="store_true",
        help="watch the --input folder: push each new complete Parquet file in name order "
        "until Ctrl-C or a _STOP file; outputs are committed as part files",
    )
    run.add_argument(
        "--name",
        default=None,
        help="name the session: `txstream query/status` reach it on the Ray cluster at "
        "--address (default: unnamed)",
    )

    query = verbs.add_parser(
        "query",
        help="print a table of a running named session",
        description="Print the rows of TABLE as of the session's watermark (printed first).",
        formatter_class=_HelpFormatter,
    )
    query.add_argument("table", metavar="TABLE", help="a table of the session's topology")
    query.add_argument(
        "--address",
        required=True,
        metavar="RAY_ADDRESS",
        help="the Ray cluster the session runs on (required)",
    )
    query.add_argument("--name", required=True, help="the session's --name (required)")
    query.add_argument(
        "--keys", default=None, metavar="K,...", help="keys, integers or strings (default: all)"
    )

    report = verbs.add_parser(
        "report",
        help="write the HTML report of a finished run",
        description="Write a self-contained HTML page with plots of a finished run (its "
        "metrics.json): events/s and latency over time, the time breakdown per executor, "
        "morphstream's decisions per batch, checkpoints and recoveries.",
        formatter_class=_HelpFormatter,
    )
    report.add_argument("output", metavar="OUTPUT", help="the run's output folder")
    report.add_argument(
        "--to", default=None, metavar="FILE", help="where to write it (default: OUTPUT/report.html)"
    )

    status = verbs.add_parser(
        "status",
        help="print a running named session's progress",
        description="Print the session's watermark, throughput and latency.",
        formatter_class=_HelpFormatter,
    )
    status.add_argument(
        "--address",
        required=True,
        metavar="RAY_ADDRESS",
        help="the Ray cluster the session runs on (required)",
    )
    status.add_argument("--name", required=True, help="the session's --name (required)")

    top = verbs.add_parser(
        "top",
        help="watch a running run's figures live",
        description="Show a running run's rate, latency, backlog, watermark, executors, "
        "checkpoints and recoveries, read every second from its metrics (a run started with "
        "--metrics-port); Ctrl-C ends it.",
        formatter_class=_HelpFormatter,
    )
    top.add_argument(
        "url",
        nargs="?",
        default=None,
        metavar="URL",
        help="the run's metrics, e.g. http://127.0.0.1:9464/metrics (or --address and --name; "
        "default: none)",
    )
    top.add_argument(
        "--address",
        default=None,
        metavar="RAY_ADDRESS",
        help="the Ray cluster a named session runs on (with --name, instead of URL; default: none)",
    )
    top.add_argument(
        "--name", default=None, help="the session's --name (with --address; default: none)"
    )
    return parser


_TYPES = {"int": int, "float": float, "str": str}


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    """`run`'s options that are `RunConfig` fields, from the fields themselves (their type,
    default and `txstream.config.option` metadata): each is declared once."""
    for f in fields(RunConfig):
        if "help" not in f.metadata:
            continue  # not an option of the command line
        meta = f.metadata
        flag = meta["flag"] or f"--{f.name.replace('_', '-')}"
        if f.type == "bool":
            action = "store_false" if flag.startswith("--no-") else "store_true"
            parser.add_argument(flag, dest=f.name, action=action, help=meta["help"])
            continue
        parser.add_argument(
            flag,
            dest=f.name,
            type=_TYPES[f.type.split(" | ")[0]],
            default=f.default,
            choices=meta["choices"],
            metavar=meta["metavar"],
            help=meta["help"],
        )


def _config_options(args: argparse.Namespace) -> dict[str, object]:
    """The `RunConfig` fields given on the command line (`_add_config_options`)."""
    return {f.name: getattr(args, f.name) for f in fields(RunConfig) if "help" in f.metadata}


def _generate(args: argparse.Namespace) -> None:
    from txstream.topologies.generators import WorkloadSpec, generate, write_workload

    try:
        spec = WorkloadSpec(
            events=args.events,
            keys=args.keys,
            theta=args.theta,
            abort_ratio=args.abort_ratio,
            txn_length=args.txn_length,
            deps=args.deps,
            seed=args.seed,
            key_type=args.key_type,
            new_keys=args.new_keys,
        )
        events, init = generate(args.topology, spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    try:
        write_workload(args.out, events, init)
    except OSError as exc:
        raise UsageError(f"cannot write {args.out}: {exc.strerror or exc}") from exc
    print(f"{args.topology}: {events.num_rows:,} events -> {args.out}")


def _run(args: argparse.Namespace) -> None:
    if args.source == "spark":
        require_spark("--source spark (the default)", instead="--source arrow")
    early = args.source == "spark" and ray_address(args.address) is None
    if early:
        from txstream.connectors import spark_driver

        # Spark's driver boots on the core that idles while the engine is imported and the
        # run planned; its Spark session then takes it (docs/performance.md)
        spark_driver.launch_early(args.log_level)
    try:
        with _uncollected():
            from txstream.job import Job

        job = Job(args.topology, **_config_options(args))
        if args.follow:
            m = _follow(job, args).metrics
        else:
            m = job.run(args.input, args.init_state, output=args.output, name=args.name).metrics
    finally:
        if early:
            spark_driver.abandon_early()  # if no Spark session took it: a run refused early
    print(summary(args.topology, args.scheduler, m, args.output))


@contextmanager
def _uncollected() -> Iterator[None]:
    """No garbage collection while the engine is imported (Ray, Spark's connector, numba's
    kernels: ~0.9 s), and what that built kept out of later ones: it lives as long as the
    process. A full collection during the import finds nothing to free, yet walks all that
    the import built: a noticeable share of a short run's time."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def summary(topology: str, scheduler: str, m: dict, output: str) -> str:
    """The one line `run` prints on stdout."""
    latency = {k: "-" if v is None else f"{v:.0f}" for k, v in m["latency_ms"].items()}
    resumed = m["config"].get("resumed_from") or 0
    return (
        f"{topology} {scheduler}: {m['events']:,} events ({m['committed']:,} committed, "
        f"{m['aborted']:,} aborted, {m['rejected']:,} rejected) in {m['seconds']:.2f} s = "
        f"{m['throughput_eps'] or 0:,.0f} events/s after {m['startup_s']:.1f} s of start-up"
        + (f" (resumed at event {resumed:,})" if resumed else "")
        + f"; latency p50 {latency['p50']} ms, p99 {latency['p99']} ms -> {output}"
    )


def _follow(job, args: argparse.Namespace):
    """``run --follow``: the first Ctrl-C ends the session cleanly (outputs and final state
    committed); a second one interrupts."""
    stop = threading.Event()

    def on_interrupt(signum, frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        job.console.warn("stopping (Ctrl-C again to interrupt)")
        stop.set()

    def on_files(files, watermark: int) -> None:
        job.console.note(f"{len(files)} file(s) pushed, watermark {watermark:,}")

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        return job.follow(args.input, args.init_state, args.output, stop, args.name, on_files)
    finally:
        signal.signal(signal.SIGINT, previous)


def _report_page(args: argparse.Namespace) -> None:
    from txstream.monitor.report import REPORT_FILE, read_metrics, write_report

    metrics = read_metrics(args.output)
    print(write_report(metrics, args.to or Path(args.output) / REPORT_FILE))


def _ask_session(args: argparse.Namespace, method: str, *call_args: object):
    """Call ``method`` of the session named ``--name`` on the Ray cluster at ``--address``
    and wait for its answer, which a failure turns into txstream's own error: the session's
    error itself (not Ray's wrapping of it), or that no answer came."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
    from txstream.session import attach

    deadline = f"txstream: failed: no answer from the Ray cluster at {args.address} within "
    with watchdog(ASK_TIMEOUT_S, f"{deadline}{ASK_TIMEOUT_S:.0f} s", EXIT_FAILURE):
        front = attach(args.address, args.name)
        try:
            return ray.get(getattr(front, method).remote(*call_args), timeout=ANSWER_TIMEOUT_S)
        except RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, TxstreamError):
                raise cause from None
            raise RuntimeFailure(
                f"session {args.name!r}: {type(cause).__name__}: {cause}"
            ) from None
        except RayActorError:
            raise RuntimeFailure(f"session {args.name!r} ended before answering") from None
        except GetTimeoutError:
            raise RuntimeFailure(
                f"session {args.name!r} did not answer within {ANSWER_TIMEOUT_S:.0f} s"
            ) from None


def _query(args: argparse.Namespace) -> None:
    keys = None
    if args.keys is not None:  # integers, or a table's natural string keys
        keys = [k.strip() for k in args.keys.split(",") if k.strip()]
        if all(k.lstrip("-").isdigit() for k in keys):
            keys = [int(k) for k in keys]
    watermark, rows = _ask_session(args, "query", args.table, keys)
    print(f"watermark {watermark}")
    print(",".join(rows.column_names))
    for row in zip(*(rows.column(c).to_pylist() for c in rows.column_names), strict=True):
        print(",".join(str(v) for v in row))


def _status(args: argparse.Namespace) -> None:
    for key, value in _flat(_ask_session(args, "status")):
        print(f"{key}: {value}")


def _top(args: argparse.Namespace) -> None:
    from txstream.monitor.top import Gone, watch

    if (args.url is None) == (args.address is None or args.name is None):
        raise UsageError("top: give the run's metrics URL, or --address and --name of a session")
    url = args.url or _metrics_url(args)
    try:
        watch(url)  # until Ctrl-C, which ends it cleanly (exit 0)
    except Gone as gone:
        last = gone.last
        print(f"run {last.run} is gone ({gone}) at watermark {last.watermark or 0:,.0f}")
        return
    if _terminated.is_set():
        raise KeyboardInterrupt  # SIGTERM: a supervisor's stop (exit 143)


def _metrics_url(args: argparse.Namespace) -> str:
    """The metrics address the named session reports in its status."""
    import ray

    url = _ask_session(args, "status").get("metrics_url")
    ray.shutdown()
    if not url:
        raise UsageError(
            f"top: session {args.name!r} serves no metrics (start it with --metrics-port)"
        )
    return url


def _flat(mapping: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    """``key: value`` pairs of a nested dictionary, nested keys joined by dots
    (``latency_ms.p50``), so that every line of `status` holds one figure."""
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


_terminated = threading.Event()
"""Set when SIGTERM came: the KeyboardInterrupt that ends the command is its doing (Ray
re-raises an interrupt as a KeyboardInterrupt of its own, so its type cannot say)."""


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM stops the command as a Ctrl-C does: what it started is stopped first."""
    _terminated.set()
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `txstream` command; returns the exit code."""
    args = _parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        verbs = {
            "generate": _generate,
            "run": _run,
            "report": _report_page,
            "query": _query,
            "status": _status,
            "top": _top,
        }
        verbs[args.verb](args)
    except (SchemaError, UsageError) as exc:
        return _report(f"error: {exc}", exc, EXIT_USAGE)
    except TxstreamError as exc:
        return _report(f"failed: {exc}", exc, EXIT_FAILURE)
    except KeyboardInterrupt as exc:
        if _terminated.is_set():
            return _report("terminated", exc, EXIT_TERMINATED)
        return _report("interrupted", exc, EXIT_INTERRUPTED)
    except Exception as exc:
        if log_of(exc) is None:
            raise  # not from a run: a bug of txstream, whose trace belongs on stderr
        return _report(f"failed: {type(exc).__name__}: {exc}", exc, EXIT_FAILURE)
    return 0


def command() -> NoReturn:
    """The `txstream` executable: `main`, then the process ends without tearing the
    interpreter down. By then the command has stopped what it started, written its
    outputs and run the exit handlers below; the teardown only frees memory and unloads
    modules, which the OS does anyway, and with Ray, RayDP, pyarrow and numba loaded it
    takes about half a second."""
    try:
        code = main()
    finally:
        if "txstream.connectors.spark_driver" in sys.modules:  # a `run`: perhaps through Spark
            from txstream.connectors.spark_driver import end_spark_driver

            end_spark_driver()
    for thread in threading.enumerate():  # as the interpreter would: non-daemon threads end
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # logging's flush, temporary folders, multiprocessing's finalizers
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say there
            pass
    os._exit(code)


def _report(message: str, exc: BaseException, code: int) -> int:
    """One line on stderr (the first line of ``message``, the log's path if any)."""
    line = message.strip().splitlines()[0] if message.strip() else message
    log = log_of(exc)
    print(f"txstream: {line}" + (f" (log: {log})" if log else ""), file=sys.stderr)
    return code
