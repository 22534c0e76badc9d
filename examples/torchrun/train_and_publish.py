"""Data-parallel training under torchrun that publishes its model with Viper from rank 0.

Every rank trains the same model (DistributedDataParallel, gloo on CPU or nccl on GPUs); rank 0
embeds a Viper node and publishes the weights every --publish-every steps. Consumers anywhere
subscribe to it: by address (rank 0 prints it, and sends it to the other ranks), or through a
registry (--registry redis://HOST:PORT), which finds the node without knowing where rank 0 ran.

    # one host, two processes (CPU):
    PYTHONPATH=build/python python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        --redirects 1 --tee 1 examples/torchrun/train_and_publish.py --steps 40 --publish-every 10 --check

    # elsewhere, while it runs (same host, or another with --listen 0.0.0.0:7300 and VIPER_TOKEN):
    viper watch torchrun-demo --connect HOST:PORT

--check: every other rank subscribes to rank 0's node and verifies that the last version it
receives equals its own replica of the model (DDP keeps the replicas identical), then exits
non-zero if not. With Debian's torch 1.13 under Python 3.11, torchrun fails at start-up with
"'NoneType' object has no attribute 'get'" unless given --redirects 1 --tee 1 (its default "0"
maps to None there). Slurm: examples/torchrun/slurm.sbatch. Environment (torchrun sets it): RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. The token, if any, is VIPER_TOKEN.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import viper


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="torchrun-demo", help="model name the versions are published under")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--publish-every", type=int, default=10, help="publish after every N steps (and the last)")
    ap.add_argument("--listen", default="127.0.0.1:0",
                    help="rank 0's node: HOST:PORT (0.0.0.0:7300 with VIPER_TOKEN for consumers on other hosts)")
    ap.add_argument("--advertise", default="",
                    help="host consumers reach rank 0's node at (default: the --listen host, or this host's own "
                         "address for 0.0.0.0)")
    ap.add_argument("--registry", default="", help="redis://HOST:PORT: register rank 0's node there")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--check", action="store_true",
                    help="ranks other than 0 subscribe and verify the last version against their replica")
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    if args.publish_every < 1 or args.steps < 1:
        print(f"train_and_publish: --steps ({args.steps}) and --publish-every ({args.publish_every}) must be >= 1",
              file=sys.stderr)
        return 2
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            print(f"train_and_publish: {var} is not set: run under torchrun (python3 -m torch.distributed.run)",
                  file=sys.stderr)
            return 2
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if use_cuda else torch.device("cpu")

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 8))
    ddp = DistributedDataParallel(model.to(device))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of the data

    token = os.environ.get("VIPER_TOKEN", "")
    publisher = None
    address = [None]
    if rank == 0:
        publisher = viper.Publisher(args.model, listen=args.listen, advertise=args.advertise, registry=args.registry,
                                    token=token)
        address[0] = publisher.address
        print(f"rank 0: publishing {args.model} from {publisher.address}", flush=True)
    dist.broadcast_object_list(address, src=0)  # every rank learns where rank 0's node listens

    subscriber = None
    if args.check and rank != 0:
        subscriber = viper.Subscriber(args.model, connect=address[0], token=token)

    published = 0
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 64, generator=gen).to(device)
        y = torch.randint(0, 8, (32,), generator=gen).to(device)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.publish_every == 0 or step == args.steps:
            published += 1
            if publisher is not None:
                result = publisher.publish(model.state_dict(), step=step, loss=float(loss))
                print(f"rank 0: step {step} loss {float(loss):.4f} -> version {result.version}, "
                      f"stall {result.stall_seconds * 1e3:.2f} ms", flush=True)
    if publisher is not None:
        publisher.wait()

    ok = True
    if subscriber is not None:
        version = subscriber.wait_for(published, timeout=60)
        mismatched = [name for name, tensor in model.state_dict().items()
                      if not np.array_equal(version[name], tensor.detach().cpu().numpy())]
        ok = not mismatched and version.version == published
        print(json.dumps({"rank": rank, "received_version": version.version, "expected_version": published,
                          "step": version.step, "mismatched": mismatched, "ok": ok}), flush=True)
        subscriber.close()
    dist.barrier()  # rank 0's node stays up until every consumer rank is done
    if publisher is not None:
        publisher.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
