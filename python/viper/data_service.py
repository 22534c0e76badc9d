"""python3 -m viper.data_service COMMAND: the data service of a node (viper.data.DataService).

    serve SOURCE --listen HOST:PORT [--max-bytes N] [--job-readers N] [--job-memory BYTES] [--token-file F]
        runs the service until SIGTERM/SIGINT; prints "listening on HOST:PORT" once it listens.
    jobs|stats --node HOST:PORT [--token-file F]        (JSON on stdout; also `viper data jobs|stats`)
    set-budget --node HOST:PORT --job NAME [--readers N] [--memory BYTES]
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from . import Error, _viper


def _token(token_file) -> str:
    """The token from --token-file, else $VIPER_TOKEN, else none: the viper command's rule."""
    return _viper._resolve_token(token_file or "")


def main(argv=None) -> int:
    from . import data as vd
    ap = argparse.ArgumentParser(prog="python3 -m viper.data_service", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the data service of this node")
    serve.add_argument("source", help="a directory tree or a record file")
    serve.add_argument("--listen", default="127.0.0.1:7600")
    serve.add_argument("--node", default="127.0.0.1:0", help="the cache node's UCX address")
    serve.add_argument("--max-bytes", type=int, default=0, help="the cache's shared memory (0: half of /dev/shm)")
    serve.add_argument("--max-samples", type=int, default=0,
                       help="samples the cache may hold (0: as many as vm.max_map_count allows)")
    serve.add_argument("--job-readers", type=int, default=4)
    serve.add_argument("--job-memory", type=int, default=64 << 20)
    serve.add_argument("--token-file", default="")
    serve.add_argument("--insecure", action="store_true")
    for name in ("jobs", "stats", "set-budget"):
        p = sub.add_parser(name)
        p.add_argument("--node", required=True, help="the data service's HOST:PORT")
        p.add_argument("--token-file", default="")
        if name == "set-budget":
            p.add_argument("--job", required=True)
            p.add_argument("--readers", type=int)
            p.add_argument("--memory", type=int)
    args = ap.parse_args(argv)
    try:
        token = _token(args.token_file)
        if args.command == "serve":
            svc = vd.DataService(vd.open_source(args.source), args.listen, node=args.node, max_bytes=args.max_bytes,
                                 max_samples=args.max_samples, job_readers=args.job_readers,
                                 job_memory=args.job_memory, token=token, insecure=args.insecure)
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            print(f"listening on {svc.address} (cache node {svc.cache.address})", flush=True)
            while not stop.wait(0.5):
                pass
            svc.close()
            return 0
        with vd.ServiceControl(args.node, token=token) as ctl:
            if args.command == "jobs":
                out = ctl.jobs()
            elif args.command == "stats":
                out = ctl.stats()
            else:
                out = ctl.set_budget(args.job, readers=args.readers, memory=args.memory)
        print(json.dumps(out, indent=1))
        return 0
    except (Error, TypeError, ValueError) as e:
        print(f"python3 -m viper.data_service {args.command}: {e}", file=sys.stderr)
        return 2 if isinstance(e, (TypeError, ValueError)) else 1


if __name__ == "__main__":
    sys.exit(main())
