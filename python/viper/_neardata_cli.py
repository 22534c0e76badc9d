"""python3 -m viper.neardata COMMAND: serve (a PipeStore), labels (read a label database),
fileserver (the baseline's storage side: raw files over HTTP), bench (near-data vs baseline)."""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import signal
import socket
import sys
import threading
import time

from . import Error, _viper


_stdout_lock = threading.Lock()


def _say(line: str) -> None:
    """One whole line to stdout. The store's threads report events while the main thread prints
    `ready` and `stats`: print() writes the text and its newline separately, and two of them at
    once gave a reader of --json two events on one line."""
    with _stdout_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _print_event(as_json: bool, event: dict) -> None:
    if as_json:
        _say(json.dumps(event))
        return
    kind, store = event["event"], event["store"]
    if kind == "version":
        if event["wire_bytes"]:
            how = f"delta against {event['delta_base']}" if event.get("delta_base") else "in full"
            how = f"{event['wire_bytes']} bytes over the network, {how}"
        else:
            how = f"{event['path']} path: no bytes over the network"
        when = " mid-pass (taken at a batch boundary)" if event.get("mid_pass") else ""
        _say(f"{store}: version {event['version']}{when} ({how}); "
             f"{event['done']}/{event['total']} labels already at it")
    elif kind == "progress":
        _say(f"{store}: version {event['version']}: {event['done']}/{event['total']} labelled, "
             f"{event['samples_per_s']} samples/s")
    elif kind == "refreshed":
        _say(f"{store}: version {event['version']}: all {event['total']} labels refreshed (pass {event['pass_seconds']} s, "
             f"{event['since_publish_seconds']} s since publish, {event['samples_per_s']} samples/s)")
    elif kind == "finetune":
        _say(f"{store}: fine-tuning job {event['job']}: extracting features for {event['rounds']} rounds "
             f"(depth {event['depth']})")
    elif kind == "features":
        _say(f"{store}: fine-tuning job {event['job']}: round {event['round']}: features of {event['samples']} samples "
             f"extracted in {event['extract_seconds']} s ({event['extract_cpu_seconds']} s CPU), published after waiting "
             f"{event['wait_seconds']} s for the Tuner's version before and {event['hold_seconds']} s after")
    else:
        _say(f"{store}: {kind}: {event}")


def _serve(args) -> int:
    if args.batch_size < 1:
        raise Error(f"--batch-size {args.batch_size}: must be >= 1")
    from .neardata import PipeStore
    options = {}
    if args.path:
        options["path"] = args.path
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    token = _token(args.token_file)
    store = PipeStore(args.model, args.factory, args.data, args.labels, connect=args.connect, registry=args.registry,
                      transform=args.transform, postprocess=args.postprocess, batch_size=args.batch_size,
                      name=args.name, features_listen=args.features_listen, token=token, insecure=args.insecure,
                      on_event=functools.partial(_print_event, args.json), **options)
    ready = {"event": "ready", "store": args.name, "total": store.stats()["total"], "time": time.time(),
             "features_address": store.features_address}
    _say(json.dumps(ready) if args.json else f"{args.name}: serving {ready['total']} samples of {args.data} "
         f"(labels in {args.labels})")
    try:
        while not stop.wait(0.2):
            s = store.stats()
            if s["error"]:
                print(f"viper.neardata serve: {s['error']}", file=sys.stderr, flush=True)
                return 1
    finally:
        if args.json:
            s = store.stats()
            s.pop("subscriber", None)
            _say(json.dumps({"event": "stats", "store": args.name, **s}))
        store.close()
    return 0


def _token(token_file) -> str:
    """The token from --token-file, else $VIPER_TOKEN, else none: the viper command's rule."""
    return _viper._resolve_token(token_file or "")


def _labels(args) -> int:
    from ._labeldb import LabelDB
    with LabelDB(args.db, readonly=True) as db:
        seen = db.seen_version
        for row in db.rows(stale=args.stale):
            if args.json:
                print(json.dumps(row))
            else:
                print(f"{row['id']}\t{row['label']}\t{row['score']:.4f}\t{row['version']}"
                      f"{'' if row['version'] == seen else ' (stale)'}")
    return 0


def _fileserver(args) -> int:
    host, port = _host_port(args.listen, "--listen")
    if not os.path.isdir(args.dir):
        raise Error(f"--dir {args.dir!r} is not a directory")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not (host in ("localhost", "::1") or host.startswith("127.")) and not args.insecure:
        raise Error(f"--listen {args.listen!r}: beyond loopback anyone who reaches the port reads every file under "
                    f"--dir (plain HTTP, no token: it is the baseline's storage side); give --insecure to mean it")

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    handler = functools.partial(_QuietHandler, directory=args.dir)
    try:
        server = Server((host, port), handler)
    except (OSError, socket.gaierror) as e:
        raise Error(f"--listen {args.listen!r}: cannot listen there: {e.strerror or e}") from None
    shown = f"[{host}]" if ":" in host else host
    print(json.dumps({"event": "ready", "address": f"{shown}:{server.server_address[1]}"}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    return 0


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no line per request
        pass


def _host_port(value: str, what: str):
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise Error(f"{what} {value!r} must be HOST:PORT (port 0-65535)")
    return host, int(port)


def _bench(args) -> int:
    from ._neardata_bench import run
    return run(args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m viper.neardata", description=" ".join(__doc__.split()))
    commands = ap.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve", help="run a PipeStore: relabel the shard on every new version")
    s.add_argument("--model", required=True)
    s.add_argument("--factory", required=True, help="MODULE:FUNCTION that builds the torch module")
    s.add_argument("--transform", help="MODULE:FUNCTION: uint8 batch [B, nbytes] -> input (default a float32 view)")
    s.add_argument("--postprocess", help="MODULE:FUNCTION: output -> (labels, scores) (default argmax, softmax)")
    s.add_argument("--data", required=True, help="the shard: a record file or a directory")
    s.add_argument("--labels", required=True, help="the label database (SQLite, created if absent)")
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--connect", help="HOST:PORT of the node that has the model")
    where.add_argument("--registry", help="redis://HOST:PORT[/DB]")
    s.add_argument("--name", default="store", help="this store's name (its features stream) [%(default)s]")
    s.add_argument("--features-listen", help="HOST:PORT to publish fine-tuning features on (FT-DMP)")
    s.add_argument("--batch-size", type=int, default=256)
    s.add_argument("--path", help="the subscriber's fetch path (auto, remote, ...)")
    s.add_argument("--token-file", help="the nodes' shared secret (default: $VIPER_TOKEN)")
    s.add_argument("--insecure", action="store_true",
                   help="let --features-listen listen beyond loopback without a token (anyone who reaches it can "
                        "read the features)")
    s.add_argument("--json", action="store_true", help="one JSON object per event")
    s.set_defaults(run=_serve)
    lab = commands.add_parser("labels", help="print a label database, one row per line")
    lab.add_argument("db")
    lab.add_argument("--stale", action="store_true", help="only labels of another version than the newest the store saw")
    lab.add_argument("--json", action="store_true", help="one JSON object per row")
    lab.set_defaults(run=_labels)
    f = commands.add_parser("fileserver", help="serve a directory's files over HTTP (the disaggregated baseline)")
    f.add_argument("--dir", required=True)
    f.add_argument("--listen", default="127.0.0.1:0")
    f.add_argument("--insecure", action="store_true",
                   help="listen beyond loopback (no authentication: anyone who reaches the port reads --dir)")
    f.set_defaults(run=_fileserver)
    b = commands.add_parser("bench", help="near-data against the disaggregated baseline on network-namespace hosts")
    _bench_arguments(b)
    b.set_defaults(run=_bench)
    args = ap.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `labels DB | head`: the reader is gone, nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Error as e:
        print(f"viper.neardata {args.command}: {e}", file=sys.stderr)
        return 2


def _bench_arguments(ap) -> None:
    ap.add_argument("--stores", default="1,2,4", help="store counts for the refresh-time rows [%(default)s]")
    ap.add_argument("--samples", type=int, default=4096, help="samples in all (split among the stores) [%(default)s]")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=4, help="fine-tuning rounds per epoch [%(default)s]")
    # 60 passes: the Tuner's training of a round (about 105 ms of CPU for 1024 features) outlasts
    # the stores' extraction of it (about 65 ms of CPU, every storage host on one CPU of a 2-CPU
    # machine), so the pipelined Tuner is the bottleneck, as FT-DMP intends, whatever the load. At
    # 10 passes (18 ms a round) the stores were, and the busy fraction followed the CPU shares the
    # machine's load left each side (70-96% under load; 18/65, under 30%, on an idle machine).
    ap.add_argument("--local-epochs", type=int, default=60,
                    help="Tuner passes over each round's features (the step size is 2 / this) [%(default)s]")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", default=None, help="scratch, kept (default: a temporary directory, removed)")
    ap.add_argument("--json", default=None, help="write the results here as JSON")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
