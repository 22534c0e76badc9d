"""Producer: trains the NT3-like model on the drifting stream and publishes versions.

Run by run_demo.py:  producer.py --config CFG.json --transport file|viper|none --out OUT.json
It prints READY once the model is built, reads 'START <ns>' on stdin, trains from that shared
start time for duration_s seconds (each batch drawn from the distribution of the current wall-clock
time), asks the publish policy after every step, and writes what it measured to OUT.json.
"""
from __future__ import annotations

import json
import os
import sys
import time

_T0 = time.perf_counter()

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/

from cl_demo.runtime import (make_logger, parse_role_args, set_torch_threads, sleep_until_ns, tune_malloc,  # noqa: E402
                             wait_for_start, write_json)

tune_malloc()  # before the first large allocation

import torch  # noqa: E402

from cl_demo.config import DemoConfig  # noqa: E402
from cl_demo.data import DriftingStream  # noqa: E402
from cl_demo.model import NT3Like, evaluate, make_optimizer, state_bytes, train_step  # noqa: E402
from cl_demo.policy import IntervalPolicy, NeverPublish, PublishPolicy  # noqa: E402
from cl_demo.transports import Transport, make_transport  # noqa: E402


def pretrain(cfg: DemoConfig, path: str) -> dict:
    """Trains version 0 on the t=0 distribution and saves its state_dict to `path`."""
    model = NT3Like(cfg.model_config(), seed=cfg.train_seed)
    stream = DriftingStream(cfg.stream_config())
    opt = make_optimizer(model, cfg.lr)
    gen = torch.Generator()
    gen.manual_seed(cfg.train_seed)
    start = time.perf_counter()
    losses = [train_step(model, opt, *stream.sample(cfg.pretrain_batch, 0.0, gen))
              for _ in range(cfg.pretrain_iters)]
    seconds = time.perf_counter() - start
    eval_gen = torch.Generator()
    eval_gen.manual_seed(cfg.data_seed + 99)
    loss, acc = evaluate(model, *stream.sample(256, 0.0, eval_gen))
    torch.save(model.state_dict(), path + ".tmp")
    os.replace(path + ".tmp", path)
    return {"iterations": cfg.pretrain_iters, "seconds": seconds, "last_train_losses": losses[-3:],
            "eval_loss_t0": loss, "eval_acc_t0": acc, "state_bytes": state_bytes(model)}


def load_version0(cfg: DemoConfig) -> NT3Like:
    """The model both processes start from: the pretrained weights in cfg.init_path."""
    model = NT3Like(cfg.model_config(), seed=cfg.train_seed, init_weights=False)
    model.load_state_dict(torch.load(cfg.init_path))
    return model


def make_policy(cfg: DemoConfig, transport: Transport) -> PublishPolicy:
    if transport.name == "none":
        return NeverPublish()
    if cfg.ipp_path:
        from cl_demo.policy import IppPolicy  # noqa: PLC0415 (needs `import viper`)
        return IppPolicy(transport.scheduler, _ipp_setup(cfg))
    return IntervalPolicy(every_iters=cfg.publish_every_iters, every_s=cfg.publish_every_s,
                          start_iteration=cfg.start_iteration,
                          name="epoch" if cfg.publish_every_s is None else "interval")


def _ipp_setup(cfg: DemoConfig) -> dict:
    with open(cfg.ipp_path, encoding="utf-8") as f:
        return json.load(f)


def make_scheduler(cfg: DemoConfig):
    """The IPP's viper.Scheduler for this run (None without cfg.ipp_path)."""
    if not cfg.ipp_path:
        return None
    import viper  # noqa: PLC0415 (only the IPP run needs the bindings here)
    from cl_demo.policy import make_scheduler as build  # noqa: PLC0415
    return build(viper, _ipp_setup(cfg))


def train_and_publish(cfg: DemoConfig, model: NT3Like, transport: Transport, policy: PublishPolicy,
                      start_ns: int) -> dict:
    """The training loop, from start_ns for cfg.duration_s seconds. Returns the measurements."""
    stream = DriftingStream(cfg.stream_config())
    opt = make_optimizer(model, cfg.lr)
    gen = torch.Generator()
    gen.manual_seed(cfg.train_seed + 1 + cfg.start_iteration)  # a continued run draws new batches
    end_ns = start_ns + int(cfg.duration_s * 1e9)
    steps, publishes = [], []
    iteration = cfg.start_iteration
    sleep_until_ns(start_ns)
    loop_start = time.perf_counter()
    while time.time_ns() < end_ns and not (cfg.max_iterations and iteration >= cfg.max_iterations):
        t_s = (time.time_ns() - start_ns) / 1e9
        step_start = time.perf_counter()
        loss = train_step(model, opt, *stream.sample(cfg.train_batch, t_s, gen))
        iteration += 1
        steps.append([iteration, round(t_s, 4), loss, time.perf_counter() - step_start])
        if policy.should_publish(iteration, loss):
            publishes.append(_publish(model, transport, iteration, loss))
            policy.on_published(iteration, publishes[-1]["stall_s"])
    loop_s = time.perf_counter() - loop_start
    if cfg.save_final_path:
        torch.save(model.state_dict(), cfg.save_final_path + ".tmp")
        os.replace(cfg.save_final_path + ".tmp", cfg.save_final_path)
    close_start = time.perf_counter()
    transport.close()
    return {
        "iterations": iteration - cfg.start_iteration,
        "start_iteration": cfg.start_iteration,
        "loop_s": loop_s,
        "compute_s": sum(s[3] for s in steps),
        "stall_s": sum(p["stall_s"] for p in publishes),
        "close_s": time.perf_counter() - close_start,
        "steps_header": ["iteration", "t_s", "loss", "step_s"],
        "steps": steps,
        "publishes": publishes,
    }


def _publish(model: NT3Like, transport: Transport, iteration: int, loss: float) -> dict:
    """Publishes one version; the stall is the wall time the training loop was blocked."""
    publish_ns = time.time_ns()
    start = time.perf_counter()
    reported = transport.publish(model.state_dict(), iteration, {"loss": loss, "publish_ns": publish_ns})
    stall = time.perf_counter() - start
    return {"step": iteration, "loss": loss, "publish_ns": publish_ns, "returned_ns": time.time_ns(),
            "stall_s": stall, "reported_stall_s": reported}


_log = make_logger(__file__)


def main(argv=None) -> int:
    args = parse_role_args("producer", __doc__, argv)

    cfg = DemoConfig.load(args.config)
    _log(f"imports done in {time.perf_counter() - _T0:.1f} s")
    set_torch_threads(torch, cfg.producer_threads)
    model = load_version0(cfg)
    transport = make_transport(args.transport, args.workdir, cfg, scheduler=make_scheduler(cfg))
    transport.start_producer()
    transport.prepare(model.state_dict())
    policy = make_policy(cfg, transport)
    _log("ready")
    start_ns = wait_for_start(sys.stdin)
    result = train_and_publish(cfg, model, transport, policy, start_ns)
    result.update({"transport": transport.describe(), "policy": policy.describe(),
                   "start_ns": start_ns, "state_bytes": state_bytes(model),
                   "threads": cfg.producer_threads})
    _log("done; writing results")
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
