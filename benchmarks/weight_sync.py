"""Weight-sync benchmark: every strategy against the raw limit of its transport, measured in one run.

    .venv/bin/python benchmarks/weight_sync.py                      # 135M (real weights) + synthetic 1B
    .venv/bin/python benchmarks/weight_sync.py --synthetic-params 0 # only the default model

Part 1 (transport): a sender actor (the trainer's role) and a receiver actor (an engine's role) move a
weight set with each strategy's own sender/receiver code, without a vLLM load at the end, next to
the raw limits measured on the same bytes in the same run: one flat gloo broadcast, a memcpy, a file
write (fsync) + read. Sets: SmolLM2-135M-Instruct in bf16 (real weights) and a synthetic ~1B-parameter
set in bf16. Prints seconds, bytes, GB/s, the ratio to the raw limit, and the cost model's prediction
(orchestrator.weight_sync.cost_model) calibrated with the raw limits, against the measurement.

Part 2 (delta size): the delta's bytes as a fraction of a full sync after one real optimizer step of
the default model at the default config's learning rate, bf16 engine weights.

Part 3 (end to end): each strategy through the controller's syncer into a real vLLM engine (CPU),
verification included, for the default model.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.weight_sync import collective_group as collective  # noqa: E402
from actors.weight_sync.collective import CollectiveSender, broadcast_stream  # noqa: E402
from actors.weight_sync.delta import DeltaEncoder  # noqa: E402
from actors.weight_sync.disk import DiskSender, disk_stream  # noqa: E402
from orchestrator.weight_sync.buckets import tensor_specs  # noqa: E402
from orchestrator.weight_sync import predict_sync, setup_from_fabric  # noqa: E402
from orchestrator.weight_sync.delta import apply_delta  # noqa: E402

GB = 1e9


def default_model_weights(dtype=torch.bfloat16) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    from orchestrator.utils.models import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("default"), dtype=torch.float32)
    return [(k, v.to(dtype).contiguous()) for k, v in model.state_dict().items() if k != "lm_head.weight"]


def synthetic_weights(num_params: float, dtype=torch.bfloat16) -> list[tuple[str, torch.Tensor]]:
    """Llama-shaped layers (hidden 2048, intermediate 5632) until `num_params`; N(0, 0.02) values."""
    g = torch.Generator().manual_seed(0)
    h, inter, out, total, layer = 2048, 5632, [], 0, 0
    out.append(("model.embed_tokens.weight", (torch.randn(32000, h, generator=g) * 0.02).to(dtype)))
    total += 32000 * h
    while total < num_params:
        for name, shape in [("self_attn.qkv", (3 * h, h)), ("self_attn.o_proj", (h, h)),
                            ("mlp.gate_up", (2 * inter, h)), ("mlp.down_proj", (h, inter))]:
            out.append((f"model.layers.{layer}.{name}.weight", (torch.randn(*shape, generator=g) * 0.02).to(dtype)))
            total += shape[0] * shape[1]
        layer += 1
    return out


def meta_of(named) -> dict:
    return {"groups": {}, "bytes": sum(t.numel() * t.element_size() for _, t in named)}


@ray.remote(num_cpus=0)
class Sender:
    """The trainer's role: holds the weights, runs the strategies' senders."""

    def __init__(self, label: str, num_params: float):
        torch.set_num_threads(os.cpu_count() or 1)
        self.named = default_model_weights() if label == "135M" else synthetic_weights(num_params)
        fn = lambda device: (self.named, meta_of(self.named))  # noqa: E731
        self.fn = fn
        self.collective = None

    def join(self, group, bucket_mb):
        self.collective = CollectiveSender(self.fn, bucket_mb, backend=collective.GLOO_BACKEND)
        self.collective.join(2, group, 600)

    def flat_broadcast(self, group) -> float:
        flat = torch.cat([t.reshape(-1) for _, t in self.named])
        t0 = time.perf_counter()
        collective.broadcast(flat, group)
        return time.perf_counter() - t0

    def strategy_broadcast(self, version) -> dict:
        return self.collective.broadcast(version)

    def disk_write(self, root, version) -> dict:
        return DiskSender(self.fn, root, 2048).write(version)

    def raw_disk_write(self, path) -> float:
        flat = torch.cat([t.reshape(-1) for _, t in self.named]).view(torch.uint8).numpy()
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(flat.data)
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - t0

    def get_named(self):
        return self.named

    def layout(self):
        return tensor_specs(self.named), sum(t.numel() for _, t in self.named), self.named[0][1].dtype

    def put_flat(self):
        flat = torch.cat([t.reshape(-1) for _, t in self.named])
        t0 = time.perf_counter()
        ref = ray.put(flat)
        return [ref], time.perf_counter() - t0

    def delta(self, version, perturb_lr: float):
        sender = DeltaEncoder(self.fn)
        sender.base, sender.base_version = {n: t.clone() for n, t in self.named}, version - 1  # one extra set
        g = torch.Generator().manual_seed(version)
        for _, t in self.named:  # an Adam-like step: every element moves by ~lr in a random direction
            t.add_((torch.randint(0, 2, t.shape, generator=g, dtype=t.dtype) * 2 - 1) * perturb_lr)
        return sender.encode(version, 1.0)


@ray.remote(num_cpus=0)
class Receiver:
    """An engine's role without vLLM: consumes each strategy's stream and touches every tensor."""

    def join(self, group, layout, bucket_mb):
        collective.join_group(collective.GLOO_BACKEND, 2, 1, group, 600)
        self.group, self.layout, self.bucket_mb = group, layout, bucket_mb

    def flat_broadcast(self, numel, dtype) -> float:
        buf = torch.empty(numel, dtype=dtype)
        t0 = time.perf_counter()
        collective.broadcast(buf, self.group)
        return time.perf_counter() - t0

    def strategy_broadcast(self, version) -> float:
        t0 = time.perf_counter()
        n = sum(t.numel() for _, t in broadcast_stream(self.layout, self.bucket_mb, version, self.group))
        return time.perf_counter() - t0 if n else -1.0

    def disk_read(self, folder, version) -> float:
        t0 = time.perf_counter()
        n = sum(t.numel() for _, t in disk_stream(folder, version))
        return time.perf_counter() - t0 if n else -1.0

    def raw_disk_read(self, path) -> float:
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            data = f.read()
        return time.perf_counter() - t0 if data else -1.0

    def object_store_read(self, refs) -> float:
        t0 = time.perf_counter()
        named = ray.get(refs[0])
        n = sum(t.numel() for _, t in named)
        return time.perf_counter() - t0 if n else -1.0

    def get_flat(self, refs) -> float:
        t0 = time.perf_counter()
        flat = ray.get(refs[0])
        return time.perf_counter() - t0 if flat.numel() else -1.0

    def apply(self, base_refs, payload_refs) -> float:
        base = dict(ray.get(base_refs[0]))
        t0 = time.perf_counter()
        payload = ray.get(payload_refs[0])
        apply_delta(base, payload)
        return time.perf_counter() - t0


def memcpy_gbps(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    t0 = time.perf_counter()
    dst.copy_(src)
    return nbytes / (time.perf_counter() - t0) / GB


def median_of(fn, repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def raw_object_store(sender, receiver) -> float:
    refs, put_s = ray.get(sender.put_flat.remote())
    get_s = ray.get(receiver.get_flat.remote(refs))
    del refs
    return put_s + get_s


def transport(label: str, num_params: float, repeats: int, bucket_mb: float, tmp: Path, rates: dict) -> list[dict]:
    """Part 1 for one weight set (built inside the sender actor): returns result rows."""
    sender, receiver = Sender.remote(label, num_params), Receiver.remote()
    specs, numel, dtype = ray.get(sender.layout.remote())
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    group = f"bench_{label}_{os.getpid()}"
    ray.get([sender.join.remote(group, bucket_mb), receiver.join.remote(group, specs, bucket_mb)])
    rows, version = [], [0]

    def both(a, b):
        return max(ray.get([a, b]))

    raw_bcast = median_of(lambda: both(sender.flat_broadcast.remote(group), receiver.flat_broadcast.remote(numel, dtype)), repeats)

    def bcast():
        version[0] += 1
        t0 = time.perf_counter()
        ray.get([sender.strategy_broadcast.remote(version[0]), receiver.strategy_broadcast.remote(version[0])])
        return time.perf_counter() - t0

    nccl = median_of(bcast, repeats)
    raw_file = tmp / f"raw_{label}.bin"

    def raw_disk():  # a fresh file each time, like each sync's fresh version folder
        raw_file.unlink(missing_ok=True)
        return ray.get(sender.raw_disk_write.remote(str(raw_file))), ray.get(receiver.raw_disk_read.remote(str(raw_file)))

    raw_runs = [raw_disk() for _ in range(repeats)]
    raw_w, raw_r = statistics.median(r[0] for r in raw_runs), statistics.median(r[1] for r in raw_runs)
    raw_file.unlink()

    def disk():
        version[0] += 1
        t0 = time.perf_counter()
        meta = ray.get(sender.disk_write.remote(str(tmp / f"sync_{label}"), version[0]))
        ray.get(receiver.disk_read.remote(meta["folder"], version[0]))
        return time.perf_counter() - t0

    disk_s = median_of(disk, repeats)

    def object_store():
        t0 = time.perf_counter()
        ref = sender.get_named.remote()
        ray.get(receiver.object_store_read.remote([ref]))
        return time.perf_counter() - t0

    obj_s = median_of(object_store, repeats)

    def delta():  # an Adam-like step at lr 2e-5 on bf16 weights, then encode -> object store -> apply
        version[0] += 1
        base_ref = sender.get_named.remote()
        payload_ref, stats_ref = sender.delta.options(num_returns=2).remote(version[0], 2e-5)
        stats = ray.get(stats_ref)
        t0 = time.perf_counter()
        apply_s = ray.get(receiver.apply.remote([base_ref], [payload_ref]))
        delta_stats.update(stats)
        return stats["encode_s"] + (time.perf_counter() - t0), apply_s

    delta_stats: dict = {}
    delta_runs = [delta() for _ in range(repeats)]
    delta_s = statistics.median(d[0] for d in delta_runs)
    mem = median_of(lambda: memcpy_gbps(nbytes), repeats)
    raw_store = median_of(lambda: raw_object_store(sender, receiver), repeats)
    setup = setup_from_fabric(numel, 2, 1, 1, 0, intra="loopback", inter="loopback", fs_write_gbps=nbytes / raw_w / GB,
                              fs_read_gbps=nbytes / raw_r / GB, memcpy_gbps=mem, load_gbps=1e6, bucket_mb=bucket_mb,
                              op_latency_s=1e-4, intra_gbps=nbytes / raw_bcast / GB, inter_gbps=nbytes / raw_bcast / GB,
                              store_gbps=2 * nbytes / raw_store / GB, encode_gbps=rates["encode_gbps"],
                              decode_gbps=rates["decode_gbps"], max_changed_fraction=1.0,
                              changed_fraction=delta_stats["changed_fraction"],
                              compressed_bytes_per_changed=rates["bytes_per_changed"])
    pred = predict_sync(setup)
    for name, secs, raw, raw_label in [("nccl (gloo)", nccl, raw_bcast, "flat gloo broadcast"),
                                       ("disk", disk_s, raw_w + raw_r, "file write+fsync+read"),
                                       ("object_store", obj_s, raw_store, "flat ray.put + get")]:
        key = name.split()[0]
        rows.append({"set": label, "strategy": name, "seconds": secs, "bytes": nbytes, "gbps": nbytes / secs / GB,
                     "raw": raw_label, "raw_s": raw, "ratio": raw / secs, "predicted_s": pred[key].seconds})
    rows.append({"set": label, "strategy": "delta", "seconds": delta_s, "bytes": delta_stats["delta_bytes"],
                 "gbps": nbytes / delta_s / GB, "raw": f"changed {delta_stats['changed_fraction']:.3f}", "raw_s": float("nan"),
                 "ratio": delta_stats["delta_bytes"] / nbytes, "predicted_s": pred["delta"].seconds})
    ray.kill(sender)
    ray.kill(receiver)
    return rows


def delta_after_real_step(lr: float) -> dict:
    """Part 2: one real optimizer step of the default model; bf16 delta size against the full set."""
    from actors.trainer.trainer import Trainer
    from orchestrator.algo import TrainBatch
    from orchestrator.config import load_config
    from orchestrator.data import load_examples, render_prompt_ids
    from orchestrator.utils.models import resolve_model_path
    from orchestrator.weight_sync.delta import encode_delta

    cfg = load_config("configs/grpo_arith_cpu.yaml", [])
    path = resolve_model_path("default")
    trainer = Trainer(str(path), cfg.trainer, cfg.algo, 1.0, 48, 2)
    before = {n: t.clone() for n, t in trainer.weights_for_sync("bfloat16")[0]}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    examples = load_examples(cfg.data)[:4]
    prompts = [render_prompt_ids(tok, ex.prompt, cfg.data.system_prompt, 256) for ex in examples for _ in range(4)]
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(10, 20000, (24,), generator=g).tolist() for _ in prompts]
    advantages = [(1.0 if i % 2 else -1.0) for i in range(len(prompts))]
    trainer.scheduler.last_epoch = max(cfg.trainer.warmup_steps, 1)  # past warmup: the full learning rate
    for group in trainer.optimizer.param_groups:
        group["lr"] = lr
    trainer.train_step(TrainBatch.with_sequence_advantages(prompts, responses, [[-1.0] * 24] * len(prompts),
                                                           advantages))
    after = {n: t.clone() for n, t in trainer.weights_for_sync("bfloat16")[0]}
    t0 = time.perf_counter()
    payload = encode_delta(before, after, 0, 1)
    enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    restored = apply_delta(before, payload)
    dec = time.perf_counter() - t0
    exact = all(torch.equal(restored[n].view(torch.int16), after[n].view(torch.int16)) for n in after)
    return {"changed_fraction": payload.changed_fraction, "delta_bytes": payload.nbytes, "full_bytes": payload.raw_bytes,
            "ratio": payload.nbytes / payload.raw_bytes, "encode_s": enc, "decode_s": dec, "bit_exact": exact,
            "lr": lr}


def end_to_end(steps: int, engine_kind: str = "in_process") -> list[dict]:
    """Part 3: each strategy through the syncer into one real vLLM engine (bf16, `rollout.engine=engine_kind`),
    verified; async_llm takes the strategies whose receiver runs outside Ray."""
    from actors.rollout.worker import RolloutWorkerActor
    from actors.trainer.trainer import TrainerActor
    from orchestrator.config import load_config
    from orchestrator.utils.models import resolve_model_path
    from orchestrator.weight_sync.syncer import make_syncer

    path = str(resolve_model_path("default"))
    out = []
    strategies = ("object_store", "disk") if engine_kind == "async_llm" else ("object_store", "disk", "nccl", "delta")
    for strategy in strategies:
        tmp = tempfile.mkdtemp(prefix="ws_e2e_")
        cfg = load_config("configs/grpo_arith_cpu.yaml", [f"weight_sync.strategy={strategy}", "rollout.dtype=bfloat16",
                                                          f"run.output_dir={tmp}", "weight_sync.delta.max_changed_fraction=1.0",
                                                          f"rollout.engine={engine_kind}"])
        trainer = TrainerActor.options(num_cpus=0).remote(path, cfg.trainer, cfg.algo, 1.0, 48, 2)
        engine = RolloutWorkerActor.options(num_cpus=0).remote(path, cfg.rollout, 0)
        ray.get([trainer.ready.remote(), engine.ready.remote()])
        syncer = make_syncer(cfg, trainer, [engine])
        times = [syncer.sync(v) for v in range(1, steps + 1)]
        last = times[-1]
        out.append({"strategy": strategy, "seconds": statistics.median(m["sync/seconds"] for m in times),
                    "bytes": last["sync/bytes"], "verified": True})
        ray.kill(trainer)
        ray.kill(engine)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic-params", type=float, default=1.0e9)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=256)
    ap.add_argument("--lr", type=float, default=2e-5, help="the demo config's learning rate")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--only-e2e", action="store_true", help="Part 3 only")
    ap.add_argument("--engines", default="in_process", help="Part 3's rollout.engine values, comma-separated")
    ap.add_argument("--syncs", type=int, default=3, help="Part 3's syncs per strategy (the median is printed)")
    args = ap.parse_args()
    os.chdir(Path(__file__).resolve().parents[1])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"VLLM_LOGGING_LEVEL": "ERROR"}})
    if args.only_e2e:
        end_to_end_report(args.engines.split(","), args.syncs)
        ray.shutdown()
        return
    tmp = Path(tempfile.mkdtemp(prefix="ws_bench_", dir=os.environ.get("BENCH_TMP", "/tmp")))
    d = delta_after_real_step(args.lr)
    # calibration of the delta's cost-model rates from this real step (used for the predictions below)
    rates = {"encode_gbps": d["full_bytes"] / d["encode_s"] / GB, "decode_gbps": d["full_bytes"] / d["decode_s"] / GB,
             "bytes_per_changed": d["delta_bytes"] / max(d["changed_fraction"] * d["full_bytes"] / 2, 1)}
    rows = transport("135M", 0, args.repeats, args.bucket_mb, tmp, rates)
    if args.synthetic_params > 0:
        rows += transport("synthetic", args.synthetic_params, args.repeats, args.bucket_mb, tmp, rates)
    print("\n## Part 1: transports (sender actor -> receiver actor, no engine load), median of", args.repeats)
    print(f"{'set':<10} {'strategy':<13} {'GB':>6} {'seconds':>8} {'GB/s':>6}  {'raw limit':<22} {'raw s':>6} "
          f"{'ratio':>6} {'predicted s':>11} {'pred/meas':>9}")
    for r in rows:
        print(f"{r['set']:<10} {r['strategy']:<13} {r['bytes'] / GB:6.2f} {r['seconds']:8.3f} {r['gbps']:6.2f}  "
              f"{r['raw']:<22} {r['raw_s']:6.3f} {r['ratio']:6.2f} {r['predicted_s']:11.3f} {r['predicted_s'] / r['seconds']:9.2f}")
    print("(delta rows: GB = compressed payload, ratio = payload / full bytes, GB/s = full bytes / seconds; "
          "synthetic delta = an Adam-like +-2e-5 step on bf16 N(0, 0.02) weights)")
    print(f"\n## Part 2: delta after one real optimizer step (SmolLM2-135M, lr {d['lr']:g}, bf16 weights)")
    print(f"changed elements {d['changed_fraction']:.4f}; delta {d['delta_bytes'] / 1e6:.1f} MB of {d['full_bytes'] / 1e6:.1f} MB "
          f"= {d['ratio']:.4f} of a full sync; encode {d['encode_s']:.2f} s, decode {d['decode_s']:.2f} s; "
          f"bit-exact after apply: {d['bit_exact']}")
    if not args.skip_e2e:
        end_to_end_report(args.engines.split(","), args.syncs)
    ray.shutdown()


def end_to_end_report(engine_kinds: list[str], syncs: int) -> None:
    for kind in engine_kinds:
        print(f"\n## Part 3: end to end into a vLLM engine (SmolLM2-135M bf16, rollout.engine={kind}, verified), "
              f"median of {syncs} syncs", flush=True)
        for r in end_to_end(syncs, kind):
            print(f"{r['strategy']:<13} {r['seconds']:7.2f} s  {r['bytes'] / 1e6:8.1f} MB moved per engine", flush=True)


if __name__ == "__main__":
    main()
