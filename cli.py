"""`txstream` command line: one verb per task (SPEC §4)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from txstream.config import ABORT, EXPLORE, GRANULARITY, PLACEMENTS, SOURCES, RunConfig
from txstream.errors import SchemaError, TxstreamError, UsageError
from txstream.schedulers import SCHEDULERS
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
    run.add_argument("--scheduler", choices=tuple(SCHEDULERS), default=defaults.scheduler)
    run.add_argument("--explore", choices=EXPLORE, default=None)
    run.add_argument("--granularity", choices=GRANULARITY, default=None)
    run.add_argument("--abort", choices=ABORT, default=None)
    run.add_argument("--executors", type=int, default=defaults.executors, metavar="N")
    run.add_argument("--placement", choices=PLACEMENTS, default=None)
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
        progress=not args.no_progress,
    )
    m = job.run(args.input, args.init_state, output=args.output).metrics
    print(
        f"{args.topology} {args.scheduler}: {m['events']:,} events "
        f"({m['committed']:,} committed, {m['aborted']:,} aborted, {m['rejected']:,} rejected) "
        f"in {m['seconds']:.3f} s = {m['throughput_eps']:,.0f} events/s; "
        f"latency p50 {m['latency_ms']['p50']} ms, p99 {m['latency_ms']['p99']} ms -> {args.output}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `txstream` command; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        {"generate": _generate, "run": _run}[args.verb](args)
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
