"""`gpurm`: submit and watch jobs, inspect the cluster, run the daemons.

Exit codes (docs/cli.md): 0 success; 1 the thing asked about failed (a job waited on ended badly); 2 bad input (a
one-line message says what to do); 3 the RM could not be reached, after riding out an outage for --retry-for
(default 60s); 4 not found (an unknown job, queue or node); 5 permission denied; 130 interrupted.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from gpurm.cli.basics import PAGE_SIZE, CliError

Command = Callable[[argparse.Namespace], int]


class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--rm", metavar="HOST:PORT[,...]",
                   help="the RM, or an active/standby RM list a:7070,b:7070 whose leader is followed (default: "
                        "$GPURM_RM, else 127.0.0.1:7070)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="table for people (default), json for scripts")
    p.add_argument("--retry-for", metavar="DURATION",
                   help="while the RM is unreachable (restarting, failing over), retry for this long, then exit 3 "
                        "(default: $GPURM_RETRY_FOR, else 60s; 0: fail at once)")
    return p


def _sub(subs: argparse._SubParsersAction, name: str, help_text: str, example: str,  # type: ignore[type-arg]
         common: bool = True) -> argparse.ArgumentParser:
    parents = [_common()] if common else []
    return subs.add_parser(name, help=help_text, description=help_text, parents=parents,  # type: ignore[no-any-return]
                           formatter_class=Formatter, epilog=f"example:\n{example}")


def _lazy(module: str, name: str) -> Command:
    """The command `name` of gpurm.cli.`module`, imported when it runs: a command loads only its own module (and
    what that imports), so `gpurm status` does not pay for the simulator, the PKI or the daemons."""
    def run(args: argparse.Namespace) -> int:
        func: Command = getattr(importlib.import_module(f"gpurm.cli.{module}"), name)
        return func(args)
    run.__qualname__ = run.__name__ = name
    return run


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole `gpurm` parser; with `command` (main() passes argv's first word), every command is listed but only
    that one gets its arguments, whose building imports that command's module (acct, admin, sim)."""
    def want(name: str) -> bool:
        return command is None or command == name

    def example(module: str) -> str:   # a command's examples live in its module: for its own --help only
        return str(importlib.import_module(f"gpurm.cli.{module}").EXAMPLE) if want(module) else ""

    parser = argparse.ArgumentParser(
        prog="gpurm", formatter_class=Formatter,
        description="gpurm: a resource manager for shared GPU clusters (RM, node agents, per-job AMs).",
        epilog="example:\n  gpurm dev-cluster --nodes 4 &      # a local cluster with fake GPUs\n"
               "  gpurm submit --gpus 8 -- python train.py\n  gpurm jobs\n\n"
               "`gpurm COMMAND --help` explains each command.")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _sub(subs, "submit", "submit a job from a YAML file, or a command after --",
             "  gpurm submit configs/jobs/train-16gpu.yaml\n"
             "  gpurm submit --gpus 2 --queue research.nlp --name probe -- python train.py --lr 3e-4\n"
             "  JOB=$(gpurm submit --gpus 1 --wait -- ./eval.sh)\n"
             "  gpurm submit --gpus 4 --placement spread -- ./serve.sh   # 4 servers, 1 GPU each\n"
             "  gpurm submit --gpus 0.25 -- python sweep.py --trial 7   # a quarter of one shared GPU\n"
             "  gpurm submit --gpus 8 --image team/torch:2.3 --mount /data --shm-size 8g -- python train.py")
    p.add_argument("file", nargs="?", help="job file (YAML: name, queue, gpus, command, workdir, env, max_retries, "
                                           "locality, placement, image, mounts, shm_size); see docs/jobs.md")
    p.add_argument("--gpus", help="GPUs for the job; MIN:MAX for an elastic job that grows and shrinks "
                   "between them, e.g. 4:16; or a fraction below 1, e.g. 0.5, for a share of one GPU that other "
                   "small jobs share too (overrides the file)")
    p.add_argument("--queue", help="leaf queue path, e.g. research.nlp (default: the file's, else `default`)")
    p.add_argument("--name", help="a name to recognise the job by")
    p.add_argument("--max-retries", type=int, help="failed attempts to retry (default 3)")
    p.add_argument("--workdir", help="directory the command runs in (default: the current directory)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set a variable (repeatable)")
    p.add_argument("--image", help="run the learners in this OCI image (podman / docker on the servers), e.g. "
                                   "registry.example/team/torch:2.3; --workdir is then a path in the image")
    p.add_argument("--mount", action="append", metavar="SRC[:DST][:ro|rw]",
                   help="image jobs: a host path the server allows (agent.yaml containers.mounts_allowed) in the "
                        "container, read-only unless :rw (repeatable)")
    p.add_argument("--shm-size", metavar="SIZE", help="image jobs: /dev/shm size, e.g. 8g (default: the engine's)")
    p.add_argument("--locality-timeout", metavar="DURATION", help="how long to wait at a locality level (60s)")
    p.add_argument("--backoff-base", metavar="DURATION", help="first back-off before relaxing locality (10s)")
    p.add_argument("--backoff-max", metavar="DURATION", help="longest back-off (10m)")
    p.add_argument("--start-level", choices=("node", "packed", "rack", "any"), help="first locality level (packed)")
    p.add_argument("--locality", choices=("strict", "prefer", "any"),
                   help="how much the job cares about locality: strict never relaxes, prefer (default) relaxes "
                        "after waiting, any does not wait for locality")
    p.add_argument("--placement", choices=("pack", "spread"),
                   help="pack (default): the fewest servers; spread: one container per server on as many servers "
                        "and racks as possible (e.g. --gpus 4 --placement spread: 4 servers, 1 GPU each)")
    p.add_argument("--wait", action="store_true", help="wait for the job to end, showing progress; exit 0 only if "
                                                      "it succeeded")
    p.set_defaults(func=_lazy("jobs", "cmd_submit"))

    p = _sub(subs, "wait", "wait for jobs to end; exit 0 only if all succeeded",
             "  gpurm wait job-3 job-4\n  gpurm wait job-3 --timeout 600 -o json")
    p.add_argument("jobs", nargs="+", metavar="JOB", help="job ids")
    p.add_argument("--timeout", type=float, default=0, help="give up after this many seconds (exit 1)")
    p.set_defaults(func=_lazy("jobs", "cmd_wait"))

    p = _sub(subs, "jobs", "list jobs (oldest first; fetched and printed a page at a time)",
             "  gpurm jobs\n  gpurm jobs --state RUNNING --queue research.nlp\n  gpurm jobs --limit 0 --user alice\n"
             "  gpurm jobs -o json | jq '.[].job_id'\n"
             "  gpurm jobs --all --name 'sweep-*' --state FAILED   # every matching job, finished ones too\n"
             "  gpurm jobs --rm rm-a:7070,rm-b:7070    # an active/standby pair: the leader answers")
    p.add_argument("--state", action="append", default=[], type=str.upper,
                   choices=("QUEUED", "ALLOCATING", "RUNNING", "SUCCEEDED", "FAILED", "KILLED"),
                   help="only jobs in this state (repeatable)")
    p.add_argument("--queue", help="only jobs of this queue")
    p.add_argument("--user", help="only jobs of this user")
    p.add_argument("--name", metavar="PATTERN", help="only jobs whose name matches this glob ('sweep-*')")
    p.add_argument("--limit", type=int, default=200, help="the most recent N matching jobs (default 200; 0: all)")
    p.add_argument("--all", action="store_const", const=0, dest="limit", help="every matching job (--limit 0)")
    p.add_argument("--page-size", type=int, default=PAGE_SIZE, help="jobs per RM request (1-5000)")
    p.set_defaults(func=_lazy("jobs", "cmd_jobs"))

    p = _sub(subs, "status", "show a job: state, attempts, placement, diagnostics",
             "  gpurm status job-3\n  gpurm status job-3 -o json")
    p.add_argument("job", help="job id, e.g. job-3")
    p.set_defaults(func=_lazy("jobs", "cmd_status"))

    p = _sub(subs, "logs", "print a job's learner (or AM) output",
             "  gpurm logs job-3            # every rank, prefixed\n  gpurm logs job-3 --rank 1 -f\n"
             "  gpurm logs job-3 --am       # the job's ApplicationMaster")
    p.add_argument("job", help="job id")
    p.add_argument("--rank", type=int, help="only this rank (default: all ranks)")
    p.add_argument("--attempt", type=int, default=0, help="attempt number (default: the latest)")
    p.add_argument("--am", action="store_true", help="the AM's log instead of the learners'")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    p.set_defaults(func=_lazy("jobs", "cmd_logs"))

    p = _sub(subs, "kill", "kill jobs (by id, or picked by user / queue / state) and wait until their processes "
             "are gone",
             "  gpurm kill job-3\n  gpurm kill job-3 job-4 --reason 'wrong learning rate' --no-wait\n"
             "  gpurm kill --user alice --state QUEUED          # asks before killing what it picked\n"
             "  gpurm kill --queue research.nlp --yes -o json   # no question (scripts)")
    p.add_argument("jobs", nargs="*", metavar="JOB", help="job ids")
    p.add_argument("--user", help="pick the live jobs of this user")
    p.add_argument("--queue", help="pick the live jobs of this queue")
    p.add_argument("--state", action="append", default=[], type=str.upper,
                   choices=("QUEUED", "ALLOCATING", "RUNNING"), help="pick live jobs in this state (repeatable)")
    p.add_argument("-y", "--yes", action="store_true", help="kill what the selectors pick without asking")
    p.add_argument("--reason", default="", help="recorded in the job's diagnostics")
    p.add_argument("--no-wait", action="store_true", help="return at once instead of waiting for the processes")
    p.set_defaults(func=_lazy("jobs", "cmd_kill"))

    p = _sub(subs, "scale", "set the size an elastic job (--gpus MIN:MAX) grows or shrinks to",
             "  gpurm scale job-3 8       # job-3 was submitted with --gpus 4:16\n"
             "  gpurm scale job-3 4 -o json")
    p.add_argument("job", help="job id of an elastic job")
    p.add_argument("gpus", type=int, help="its new size, between the job's min and max GPUs")
    p.set_defaults(func=_lazy("jobs", "cmd_scale"))

    p = _sub(subs, "acct", "accounting: GPU-hours, job counts, queueing time and outcomes of finished jobs, per user, "
             "queue and/or day", example("acct"), common=False)
    if want("acct"):
        from gpurm.cli import acct
        acct.add_arguments(p)
    p.set_defaults(func=_lazy("acct", "cmd_acct"))

    p = _sub(subs, "nodes", "list nodes by id: rack, GPUs free/total, state (fetched and printed a page at a time; "
             "the RM applies the filters)",
             "  gpurm nodes\n  gpurm nodes --limit 20\n  gpurm nodes -o json | jq '.[].node_id'\n"
             "  gpurm nodes --rack rack-7 --free 8          # whole free servers in one rack\n"
             "  gpurm nodes --state LOST --state UNHEALTHY  # what needs a look\n"
             "  gpurm nodes --model 'H100*' --name 'gpu-1*'")
    p.add_argument("--limit", type=int, default=0, help="the first N matching nodes by id (default 0: all)")
    p.add_argument("--state", action="append", default=[], type=str.upper,
                   choices=("RUNNING", "UNHEALTHY", "LOST", "DRAINING", "DECOMMISSIONED"),
                   help="only nodes in this state (repeatable)")
    p.add_argument("--rack", help="only nodes of this rack (or InfiniBand domain)")
    p.add_argument("--model", help="only nodes with a GPU of this model (a glob: 'H100*')")
    p.add_argument("--free", type=int, default=0, metavar="N", help="only nodes with at least N free GPUs")
    p.add_argument("--name", metavar="PATTERN", help="only node ids matching this glob ('gpu-1*', 'node-0[1-3]')")
    p.add_argument("--page-size", type=int, default=PAGE_SIZE, help="nodes per RM request (1-5000)")
    p.set_defaults(func=_lazy("cluster", "cmd_nodes"))

    p = _sub(subs, "queues", "show the queue tree: shares, usage, demand", "  gpurm queues")
    p.set_defaults(func=_lazy("cluster", "cmd_queues"))

    admin = subs.add_parser("admin", help="operator commands (queues, draining, security)", formatter_class=Formatter,
                            description="operator commands", epilog="example:\n  gpurm admin drain node-3\n"
                            "  gpurm admin refresh-queues configs/queues.yaml\n"
                            "  gpurm admin check-queues configs/queues.yaml --capacity 512\n"
                            "  gpurm admin info")
    asubs = admin.add_subparsers(dest="admin_command", metavar="SUBCOMMAND")
    p = _sub(asubs, "refresh-queues", "load a new queue config into the running RM (all-or-nothing)",
             "  gpurm admin refresh-queues configs/queues.yaml\n  gpurm admin refresh-queues   # reread the RM's file")
    p.add_argument("file", nargs="?", help="queues YAML (default: the file the RM was started with)")
    p.set_defaults(func=_lazy("cluster", "cmd_refresh_queues"))
    p = _sub(asubs, "check-queues", "validate a queue config offline and show each queue's steady share",
             "  gpurm admin check-queues configs/queues.yaml --capacity 512 -o json")
    p.add_argument("file", help="queues YAML")
    p.add_argument("--capacity", type=int, required=True, help="cluster size in GPUs")
    p.set_defaults(func=_lazy("cluster", "cmd_check_queues"))
    p = _sub(asubs, "drain", "stop offering a node's GPUs (running work continues)",
             "  gpurm admin drain node-3\n  gpurm admin drain node-3 --undo")
    p.add_argument("node", help="node id")
    p.add_argument("--undo", action="store_true", help="offer the node's GPUs again")
    p.set_defaults(func=_lazy("cluster", "cmd_drain"))
    if want("admin"):
        from gpurm.cli import admin as admin_cli
        from gpurm.cli import broker
        from gpurm.cli.ha import add_ha_parser
        from gpurm.cli.store import add_store_parser
        admin_cli.add_parsers(asubs, _sub)
        broker.add_broker_parser(asubs)
        add_store_parser(asubs)
        add_ha_parser(asubs)
    admin.set_defaults(func=lambda a: _missing_sub(admin))

    p = _sub(subs, "completion", "print a shell completion script (commands, flags, choices, job ids)",
             "  eval \"$(gpurm completion bash)\"     # in ~/.bashrc\n"
             "  eval \"$(gpurm completion zsh)\"      # in ~/.zshrc", common=False)
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=_lazy("completion", "cmd_completion"))

    p = _sub(subs, "version", "print the client's version, the Python it runs on, whether its compiled build is in "
             "use, and the RM's version",
             "  gpurm version\n  gpurm version -o json --rm rm.example.org:7070", common=False)
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--rm", metavar="HOST:PORT[,...]", help="the RM, or an RM list a:7070,b:7070, to ask for its "
                   "version (default: $GPURM_RM, else 127.0.0.1:7070)")
    p.set_defaults(func=cmd_version)

    p = _sub(subs, "rm", "run the ResourceManager daemon (exit 0 stopped, 1 a stop that hung, 2 cannot start, 3 no "
                         "longer the leader of an HA set: restart it, it stands by)",
             "  gpurm rm --config configs/rm.yaml", common=False)
    p.add_argument("--config", help="rm.yaml (see configs/rm.yaml)")
    p.add_argument("--listen", help="HOST:PORT for gRPC (overrides the file)")
    p.add_argument("--state-dir", help="where the RM keeps its store and key (overrides the file)")
    p.add_argument("--mqtt-url", help="external broker mqtt://HOST:PORT (default: run an embedded one)")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    p.set_defaults(func=_lazy("daemons", "cmd_rm"))

    p = _sub(subs, "agent", "run a node agent on this GPU server",
             "  gpurm agent --config configs/agent.yaml\n"
             "  gpurm agent --config configs/agent.yaml --rm rm-a:7070,rm-b:7070   # an active/standby RM pair\n"
             "  gpurm agent --discover            # the GPUs and topology NVML finds, then exit", common=False)
    p.add_argument("--config", help="agent.yaml (see configs/agent.yaml)")
    p.add_argument("--node-id", help="this node's id (overrides the file)")
    p.add_argument("--rm", metavar="HOST:PORT[,...]",
                   help="the RM, or an active/standby RM list a:7070,b:7070 (overrides the file's rm)")
    p.add_argument("--listen", help="HOST:PORT for the ContainerManager service (port 0: any free port)")
    p.add_argument("--rack", help="rack / IB domain name")
    p.add_argument("--state-dir", help="where the agent keeps container state and logs")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    p.add_argument("--discover", action="store_true",
                   help="print the GPUs and topology the provider finds (NVML without --config) and exit")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table", help="with --discover")
    p.set_defaults(func=_lazy("daemons", "cmd_agent"))

    p = _sub(subs, "dev-cluster", "run an RM and agents with fake GPUs on this machine (Ctrl-C stops all)",
             "  gpurm dev-cluster --nodes 4 --gpus-per-node 8 --racks 2\n"
             "  gpurm dev-cluster --state-dir /tmp/mycluster --port 7171   # then: . /tmp/mycluster/env.sh\n"
             "  gpurm dev-cluster --tls   # mTLS with certificates made on the fly\n"
             "  gpurm dev-cluster --http-port 0   # the web UI on a free port (it prints the URL)\n"
             "  gpurm dev-cluster --agent-option telemetry.container_interval=1s   # usage series every second\n"
             "  gpurm dev-cluster --rms 2 --store postgresql://gpurm@127.0.0.1:5432/gpurm   # a leader and a standby\n"
             "  sudo gpurm dev-cluster --netns --nodes 3   # each agent in a network namespace, its own address",
             common=False)
    p.add_argument("--nodes", type=int, default=4, help="agents to start (default 4)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="fake GPUs per agent (default 8)")
    p.add_argument("--racks", type=int, default=2, help="racks to spread the nodes over (default 2)")
    p.add_argument("--state-dir", help="where state and logs go (default: a new temporary directory)")
    p.add_argument("--port", type=int, default=7070, help="the RM's gRPC port (default 7070)")
    p.add_argument("--http-port", type=int, default=7080,
                   help="the RM's web UI and REST API port (default 7080; 0 picks a free one)")
    p.add_argument("--mqtt-url", help="use this broker instead of the RM's embedded one")
    p.add_argument("--nvlink-islands", type=int, default=1, help="NVLink islands per fake server (default 1)")
    p.add_argument("--heartbeat", default="1s", help="agent heartbeat interval (default 1s)")
    p.add_argument("--missed-beats", type=int,
                   help="missed beats before a node is LOST (default 10, or with --rms 2 the fewest whose agents' "
                        "lease outlasts a takeover; an agent fences itself before that)")
    p.add_argument("--queues", help="queues YAML for the RM (default: one `default` queue)")
    p.add_argument("--rm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra rm.yaml setting, dotted (e.g. am.liveness_timeout=20s); repeatable")
    p.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra agent.yaml setting for every agent, dotted (e.g. telemetry.container_interval=1s); "
                        "repeatable")
    p.add_argument("--tls", action="store_true",
                   help="mTLS everywhere: a CA and every certificate are made on the fly under STATE/pki")
    p.add_argument("--store", metavar="URL", default="",
                   help="the RMs' store: sqlite:///PATH or postgresql://USER@HOST:PORT/DB (default: a SQLite file in "
                        "the RM's state dir)")
    p.add_argument("--netns", action="store_true",
                   help="(root) run each agent and its jobs in a network namespace of its own, gpurm-CLUSTER-NODE, "
                        "with its own address on a bridge where the RM listens; cluster.json lists them")
    p.add_argument("--rms", type=int, default=1,
                   help="RMs to run on the one --store (postgresql:// needed for 2 or more): one leads, the others "
                        "stand by and take over; the dev cluster restarts any that exits (default 1)")
    p.set_defaults(func=_lazy("devcluster", "cmd_dev_cluster"))

    p = _sub(subs, "sim", "replay a workload trace through the real scheduler on a virtual clock", example("sim"),
             common=False)
    if want("sim"):
        from gpurm.cli import sim
        sim.add_arguments(p)
    p.set_defaults(func=_lazy("sim", "cmd_sim"))

    return parser


def cmd_version(args: argparse.Namespace) -> int:
    """`gpurm version`: which gpurm, which Python, compiled or interpreted (and why)."""
    import json
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from gpurm import native

    try:
        gpurm_version = version("gpurm")
    except PackageNotFoundError:
        gpurm_version = "unknown (not installed)"
    build = native.status()
    rm = rm_version(args.rm)
    info = {"gpurm": gpurm_version, "python": f"{platform.python_implementation()} {platform.python_version()}",
            "build": build.build, "detail": build.reason, "stale": build.stale, "rm": rm}
    if args.output == "json":
        print(json.dumps(info))
    else:
        print(f"client: gpurm {info['gpurm']} on {info['python']}: {info['detail']}")
        answer = f"gpurm {rm['version']}" if rm["version"] else f"not reached ({rm['error']})"
        print(f"RM at {rm['address']}: {answer}")
    return 0


def rm_version(flag: str | None) -> dict[str, str]:
    """The RM's version as it answers (a short timeout: `gpurm version` must work without an RM)."""
    from gpurm.cli.client import RM, rm_address
    from gpurm.proto import gpurm_pb2 as pb

    address = rm_address(flag)
    try:
        rm = RM(address, timeout=3.0, retry_for=0.0)       # a version check does not wait out an outage
        info = rm.call(rm.client.GetClusterInfo, pb.ClusterInfoRequest())
    except CliError as exc:
        return {"address": address, "version": "", "error": exc.message}
    return {"address": address, "version": info.version, "error": ""}


def _missing_sub(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if args_list and args_list[0] == "submit" and "--" in args_list:
        cut = args_list.index("--")
        args_list, command = args_list[:cut], args_list[cut + 1:]
    parser = build_parser(args_list[0] if args_list and not args_list[0].startswith("-") else "")
    args = parser.parse_args(args_list)
    args.command_argv = command
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    if args.command not in ("rm", "agent", "dev-cluster"):
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except CliError as exc:
        sys.stderr.write(f"gpurm {args.command}: error: {exc.message}\n")
        return exc.code
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130
    except BrokenPipeError:
        return 0


# Commands after which the process holds a large heap that nothing needs tearing down (see entry).
_FAST_EXIT = ("sim",)


def entry() -> NoReturn:
    """The `gpurm` console script: main(), then exit.

    `gpurm sim` holds a whole replay (hundreds of thousands of objects, most of them in reference cycles) until the
    process ends. The cyclic collector stays off for the whole command: switched back on, its first collection
    walks every object the replay made and frees the engine's cycles (1-3 s, more for long replays), and the
    interpreter's teardown (a full collection, then freeing each object) costs as much again, for a process that
    is exiting anyway. So the process ends at once after main(), once what was written is flushed. Every other
    command exits the ordinary way (the daemons' atexit hooks and finalizers run), and so does every command under
    a profiler or tracer (cProfile, coverage: they write their results at exit). main() itself never exits nor
    touches the collector, so tests call it in-process."""
    watched = sys.getprofile() is not None or sys.gettrace() is not None
    quick = bool(sys.argv[1:2]) and sys.argv[1] in _FAST_EXIT and not watched
    if quick:
        gc.disable()
    code = main()
    if quick:
        logging.shutdown()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:       # the reader went away (`gpurm sim ... | head`): nothing left to say
            pass
        except OSError:               # a write that failed: report it through the ordinary exit
            sys.exit(code or 1)
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
