"""`txstream` command line: one verb per task (SPEC §4)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from txstream.config import PLACEMENTS, SOURCES, RunConfig
from txstream.errors import SchemaError, TxstreamError, UsageError
from txstream.schedulers import PLANNED, SCHEDULERS
from txstream.topologies import BUNDLED

EXIT_USAGE = 2
EXIT_FAILURE = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txstream", description="Transactional stream processing on Ray."
    )
    verbs = parser.add_subparsers(dest="verb", required=True)

    gen = verbs.add_parser("generate", help="write a synthetic workload (events + init state)")
    gen.add_argument("topology", choices=BUNDLED)
    gen.add_argument("--out", required=True, metavar="DIR")
    gen.add_argument("--events", type=int, default=1_000_000, metavar="N")
    gen.add_argument("--keys", type=int, default=10_000, metavar="K")
    gen.add_argument("--theta", type=float, default=0.2, metavar="T", help="Zipf skew")
    gen.add_argument("--abort-ratio", type=float, default=0.01, metavar="A")
    gen.add_argument("--txn-length", type=int, default=None, metavar="L")
    gen.add_argument("--deps", type=int, default=None, metavar="R")
    gen.add_argument("--seed", type=int, default=0, metavar="S")

    defaults = RunConfig()
    run = verbs.add_parser("run", help="run a topology over events")
    run.add_argument("topology", choices=BUNDLED)
    run.add_argument("--input", required=True, metavar="EVENTS", help="Parquet file or folder")
    run.add_argument("--init-state", required=True, metavar="DIR")
    run.add_argument("--output", required=True, metavar="DIR")
    run.add_argument("--scheduler", choices=(*SCHEDULERS, *PLANNED), default=defaults.scheduler)
    run.add_argument("--explore", choices=("auto", "bfs", "dfs", "ns"), default=defaults.explore)
    run.add_argument(
        "--granularity", choices=("auto", "fine", "coarse"), default=defaults.granularity
    )
    run.add_argument("--abort", choices=("auto", "eager", "lazy"), default=defaults.abort)
    run.add_argument("--executors", type=int, default=defaults.executors, metavar="N")
    run.add_argument("--placement", choices=PLACEMENTS, default=defaults.placement)
    run.add_argument(
        "--sockets",
        type=int,
        default=None,
        help="split the usable cores into S emulated sockets (default: the host's own)",
    )
    run.add_argument(
        "--punctuation-interval", type=int, default=defaults.punctuation_interval, metavar="N"
    )
    run.add_argument("--udf-cost-us", type=float, default=defaults.udf_cost_us, metavar="C")
    run.add_argument("--source", choices=SOURCES, default=defaults.source)
    run.add_argument("--address", default=None, metavar="RAY_ADDRESS")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--overwrite", action="store_true", help="replace a non-empty output (at commit)"
    )
    run.add_argument(
        "--punctuation-ms",
        type=float,
        default=defaults.punctuation_ms,
        metavar="MS",
        help="cut a punctuation batch once its oldest event has waited MS ms",
    )
    run.add_argument(
        "--latency-target-ms",
        type=float,
        default=defaults.latency_target_ms,
        metavar="MS",
        help="size the work in flight so that outputs follow inputs within MS ms",
    )
    run.add_argument(
        "--follow",
        action="store_true",
        help="watch the --input folder: push each new complete Parquet file in name order "
        "until Ctrl-C or a _STOP file; outputs are committed as part files",
    )
    run.add_argument(
        "--name", default=None, help="name the session: `txstream query/status` reach it"
    )
    run.add_argument(
        "--checkpoint-dir",
        default=None,
        metavar="D",
        help="write checkpoints to D: the run survives failures, and the same command run "
        "again after a crash resumes from the last checkpoint",
    )
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="B",
        help="punctuation batches between checkpoints (default 100; needs --checkpoint-dir)",
    )

    query = verbs.add_parser("query", help="print a table of a running named session")
    query.add_argument("table")
    query.add_argument("--address", required=True, metavar="RAY_ADDRESS")
    query.add_argument("--name", required=True, help="the session's --name")
    query.add_argument("--keys", default=None, metavar="K,...", help="keys (default: all)")

    status = verbs.add_parser("status", help="print a running named session's progress")
    status.add_argument("--address", required=True, metavar="RAY_ADDRESS")
    status.add_argument("--name", required=True, help="the session's --name")
    return parser


def _generate(args: argparse.Namespace) -> None:
    from txstream.topologies._generators import WorkloadSpec, generate, write_workload

    try:
        spec = WorkloadSpec(
            events=args.events,
            keys=args.keys,
            theta=args.theta,
            abort_ratio=args.abort_ratio,
            txn_length=args.txn_length,
            deps=args.deps,
            seed=args.seed,
        )
        events, init = generate(args.topology, spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    write_workload(args.out, events, init)
    print(f"{args.topology}: {events.num_rows:,} events -> {args.out}")


def _run(args: argparse.Namespace) -> None:
    from txstream.job import Job

    job = Job(
        args.topology,
        scheduler=args.scheduler,
        explore=args.explore,
        granularity=args.granularity,
        abort=args.abort,
        executors=args.executors,
        placement=args.placement,
        sockets=args.sockets,
        punctuation_interval=args.punctuation_interval,
        udf_cost_us=args.udf_cost_us,
        source=args.source,
        address=args.address,
        punctuation_ms=args.punctuation_ms,
        latency_target_ms=args.latency_target_ms,
        overwrite=args.overwrite,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        progress=not args.no_progress,
    )
    if args.follow:
        m = _follow(job, args).metrics
    else:
        m = job.run(args.input, args.init_state, output=args.output, name=args.name).metrics
    print(
        f"{args.topology} {args.scheduler}: {m['events']:,} events "
        f"({m['committed']:,} committed, {m['aborted']:,} aborted, {m['rejected']:,} rejected) "
        f"in {m['seconds']:.3f} s = {m['throughput_eps']:,.0f} events/s; "
        f"latency p50 {m['latency_ms']['p50']} ms, p99 {m['latency_ms']['p99']} ms -> {args.output}"
    )


def _follow(job, args: argparse.Namespace):
    """``run --follow``: the first Ctrl-C ends the session cleanly (outputs and final state
    committed); a second one interrupts."""
    stop = threading.Event()

    def on_interrupt(signum, frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        print("txstream: stopping (Ctrl-C again to interrupt)", file=sys.stderr)
        stop.set()

    def on_files(files, watermark: int) -> None:
        print(f"{len(files)} file(s) pushed, watermark {watermark:,}", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        return job.follow(args.input, args.init_state, args.output, stop, args.name, on_files)
    finally:
        signal.signal(signal.SIGINT, previous)


def _remote_session(args: argparse.Namespace):
    """The named session's ProgressController on the Ray cluster at ``--address``."""
    from txstream.session import attach

    return attach(args.address, args.name)


def _query(args: argparse.Namespace) -> None:
    import ray

    keys = None
    if args.keys is not None:
        try:
            keys = [int(k) for k in args.keys.split(",") if k.strip()]
        except ValueError as exc:
            raise UsageError(f"--keys must be integers separated by commas: {args.keys}") from exc
    watermark, rows = ray.get(_remote_session(args).query.remote(args.table, keys), timeout=60)
    print(f"watermark {watermark}")
    print(",".join(rows.column_names))
    for row in zip(*(rows.column(c).to_pylist() for c in rows.column_names), strict=True):
        print(",".join(str(v) for v in row))


def _status(args: argparse.Namespace) -> None:
    import ray

    status = ray.get(_remote_session(args).status.remote(), timeout=60)
    for key, value in status.items():
        print(f"{key}: {value}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `txstream` command; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        {"generate": _generate, "run": _run, "query": _query, "status": _status}[args.verb](args)
    except (SchemaError, UsageError) as exc:
        print(f"txstream: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TxstreamError as exc:
        print(f"txstream: failed: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("txstream: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
