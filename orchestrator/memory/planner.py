"""The VRAM plan: bytes of every role per device, whether each device fits, and changes that would (pure).

    plan = plan_memory(model_shape(PRESETS["llama3-8b"]), RunShape(lora_rank=16), device_bytes=24 * GIB)
    print(format_plan(plan))     # a table per role, a line per device, suggestions when one does not fit

Layout: on a CPU host every role shares the host's memory. On GPUs each trainer rank has a GPU; the
roles named in `RunShape.colocated` share it (a trainer GPU holds a rank, its share of the engines, and
the reference); the others get GPUs of their own. A reward model runs in a CPU actor: host memory.
Per-role formulas: orchestrator.memory.estimate.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.memory import estimate as est
from orchestrator.memory import longctx
from orchestrator.memory.estimate import GIB, RunShape
from orchestrator.memory.shapes import ModelShape

COLUMNS = ("weights", "grads", "optimizer", "activations", "logits", "kv_cache", "other", "runtime")


@dataclass
class RoleMemory:
    """One role's bytes per instance (per rank / engine shard) by component; `count` instances."""

    role: str
    count: int
    parts: dict
    device: str = ""

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass
class DeviceMemory:
    """A device and what it holds: `roles` (one instance each); fits is None when its size is unknown."""

    name: str
    roles: list
    used_bytes: int
    device_bytes: Optional[int]
    problems: list = field(default_factory=list)

    @property
    def fits(self) -> Optional[bool]:
        if self.device_bytes is None:
            return None
        return self.used_bytes <= self.device_bytes and not self.problems


@dataclass
class MemoryPlan:
    """The plan: roles (the table rows), devices (fit or not) and suggestions (when one does not fit)."""

    model: ModelShape
    run: RunShape
    roles: list
    devices: list
    suggestions: list = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """False when a device of known size does not fit; devices of unknown size are not judged."""
        return all(d.fits is not False for d in self.devices)


def _gpu_roles(model: ModelShape, run: RunShape) -> list:
    """(role, instances, parts) for the roles that are not engines, before devices are assigned."""
    out = [("trainer", run.trainer_ranks, est.trainer_bytes(model, run))]
    whole = dataclasses.replace(run, context_parallel=1)  # the critic does not split sequences
    if run.algorithm == "ppo" and run.critic_ranks:  # the critic as a run starts it (RunShape.critic_ranks)
        shape = dataclasses.replace(whole, trainer_ranks=run.critic_ranks, lora_rank=0, packing_tokens=0,
                                    micro_batch_size=run.critic_micro_batch_size or run.micro_batch_size)
        out.append(("critic", run.critic_ranks, est.critic_bytes(model, shape)))
    elif run.algorithm == "ppo":
        out.append(("critic", run.trainer_ranks, est.critic_bytes(model, whole)))
    if run.algorithm == "dpo":
        out.append(("reference", 1, est.frozen_forward_bytes(model, run)))
    elif run.reference:  # c ranks under context parallelism (actors/reference_cp.py), each a full frozen copy
        out.append(("reference", max(1, run.context_parallel), est.frozen_forward_bytes(model, run, split=True)))
    return out


def _reward_role(run: RunShape) -> Optional[RoleMemory]:
    if run.reward_model is None:
        return None
    return RoleMemory("reward", 1, est.frozen_forward_bytes(run.reward_model, run))


def _engine_shards(run: RunShape) -> int:
    return 0 if run.algorithm == "dpo" else run.engines * run.engine_tp


def plan_memory(model: ModelShape, run: RunShape, device_bytes: Optional[int],
                host_bytes: Optional[int] = None, suggest: bool = True) -> MemoryPlan:
    """Per-role bytes, per-device totals and fit, for `model` trained as `run` on devices of
    `device_bytes` (None = unknown: nothing is judged). On run.device == "cpu" the device is the host.

    Raises ValueError naming the RunShape field when a count or fraction is out of range.
    """
    _check(run)
    if run.device == "cpu":
        plan = _plan_cpu(model, run, device_bytes)
    else:
        plan = _plan_gpu(model, run, device_bytes, host_bytes)
    if suggest and not plan.fits:
        plan.suggestions = suggestions(model, run, device_bytes, host_bytes)
    return plan


def _check(run: RunShape) -> None:
    for name in ("trainer_ranks", "micro_batch_size", "seq_len", "engines", "engine_tp", "block_size"):
        if getattr(run, name) < (0 if name == "engines" else 1):
            raise ValueError(f"{name}: must be >= {0 if name == 'engines' else 1} (got {getattr(run, name)})")
    if not 0 < run.gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization: must be in (0, 1] (got {run.gpu_memory_utilization})")
    if run.algorithm not in ("grpo", "ppo", "dpo") or run.precision not in ("fp32", "bf16-autocast", "fp8"):
        raise ValueError(f"algorithm / precision: got {run.algorithm!r} / {run.precision!r}; allowed "
                         "grpo|ppo|dpo and fp32|bf16-autocast|fp8")
    if run.context_parallel < 1 or run.trainer_ranks % run.context_parallel:
        raise ValueError(f"context_parallel: must be >= 1 and divide trainer_ranks={run.trainer_ranks} "
                         f"(got {run.context_parallel})")


def _plan_cpu(model: ModelShape, run: RunShape, host: Optional[int]) -> MemoryPlan:
    roles = [RoleMemory(name, n, parts, "host") for name, n, parts in _gpu_roles(model, run)]
    if _engine_shards(run):
        roles.append(RoleMemory("rollout", run.engines, est.engine_bytes(model, run, 0, 0), "host"))
    reward = _reward_role(run)
    if reward is not None:
        reward.device = "host"
        roles.append(reward)
    used = sum(r.total * r.count for r in roles)
    device = DeviceMemory("host (CPU run: every role)", [r.role for r in roles], used, host)
    return MemoryPlan(model, run, roles, [device])


def _plan_gpu(model: ModelShape, run: RunShape, device_bytes: Optional[int], host: Optional[int]) -> MemoryPlan:
    colocated = set(run.colocated) | {"trainer"}
    roles, devices, on_trainer = [], [], []
    for name, count, parts in _gpu_roles(model, run):
        role = RoleMemory(name, count, parts, "trainer GPU" if name in colocated else f"{name} GPU")
        roles.append(role)
        if name in colocated:
            on_trainer.append(role)
        else:
            devices.append(DeviceMemory(f"{name} GPU (x{count})", [name], role.total, device_bytes))
    held, names, problems = sum(r.total for r in on_trainer), [r.role for r in on_trainer], []
    shards = _engine_shards(run)
    if shards and "rollout" in colocated:  # engine shards spread over the trainer GPUs, after the roles there
        for _ in range(math.ceil(shards / run.trainer_ranks)):
            parts, problem = _engine_on(model, run, device_bytes, held)
            held, problems, names = held + sum(parts.values()), problems + problem, names + ["rollout"]
        roles.append(RoleMemory("rollout", shards, parts, "trainer GPU"))
    elif shards:
        parts, problem = _engine_on(model, run, device_bytes, 0)
        roles.append(RoleMemory("rollout", shards, parts, "rollout GPU"))
        devices.append(DeviceMemory(f"rollout GPU (x{shards})", ["rollout"], sum(parts.values()), device_bytes,
                                    problem))
    devices.insert(0, DeviceMemory(f"trainer GPU (x{run.trainer_ranks})", names, held, device_bytes, problems))
    reward = _reward_role(run)
    if reward is not None:
        reward.parts["runtime"] = est.RUNTIME_BYTES["cpu"]
        reward.device = "host"
        roles.append(reward)
        devices.append(DeviceMemory("host (reward actor, CPU)", ["reward"], reward.total, host))
    return MemoryPlan(model, run, roles, devices)


def _engine_on(model: ModelShape, run: RunShape, device_bytes: Optional[int], others: int) -> tuple:
    """(parts, problems) of one engine shard on a GPU where colocated roles already hold `others`."""
    if device_bytes is None:
        return est.engine_bytes(model, dataclasses.replace(run, device="cpu", kv_cache_gib=0), 0, 0), []
    parts = est.engine_bytes(model, run, device_bytes, others)
    problems = []
    claim = int(run.gpu_memory_utilization * device_bytes)
    if claim > device_bytes - others:
        fraction = math.floor((device_bytes - others) / device_bytes * 20) / 20
        fix = (f"set rollout.gpu_memory_utilization <= {fraction:.2f}" if fraction > 0
               else "no room is left for the engine")
        problems.append(f"rollout: the engine asks for gpu_memory_utilization x device = {claim / GIB:.1f} GiB "
                        f"but {others / GIB:.1f} GiB are held by colocated roles (vLLM refuses to start or the "
                        f"trainer runs out later): {fix}")
    need = est.min_kv_bytes(model, run)
    if parts["kv_cache"] < need:
        problems.append(f"rollout: KV cache {parts['kv_cache'] / GIB:.2f} GiB < {need / GIB:.2f} GiB for one "
                        f"max_model_len={run.max_model_len} sequence")
    return parts, problems
def _candidates(run: RunShape) -> list:
    """(kind, config change, RunShape overrides), mild to strong within a kind."""
    out = []
    if run.packing_tokens > 1:
        out += [("mbs", f"trainer.micro_batch_tokens={t}", dict(packing_tokens=t))
                for t in _halvings(run.packing_tokens, 256)]
    else:
        out += [("mbs", f"trainer.micro_batch_size={m}", dict(micro_batch_size=m))
                for m in _halvings(run.micro_batch_size, 1)]
    if not run.gradient_checkpointing:
        out.append(("ckpt", "trainer.gradient_checkpointing=true", dict(gradient_checkpointing=True)))
    if not run.lora_rank:
        out.append(("lora", "trainer.lora.rank=16 (LoRA)", dict(lora_rank=16)))
    if run.device == "cpu":
        out += [("kv", f"rollout.kv_cache_space_gib={g:g}", dict(kv_cache_gib=g))
                for g in _halvings(int(run.kv_cache_gib), 1)]
        return out + [("engines", f"rollout.num_workers={e}", dict(engines=e)) for e in _halvings(run.engines, 1)]
    out += [("shards", f"trainer.num_workers={run.trainer_ranks * k} (FSDP shards)",
             dict(trainer_ranks=run.trainer_ranks * k)) for k in (2, 4, 8, 16, 32, 64)]
    if run.algorithm == "ppo" and run.critic_ranks:  # PPO's critic shards like the trainer (actors/critic_sharded.py)
        out += [("critic-shards", f"critic.num_workers={run.critic_ranks * k} (FSDP shards of the critic)",
                 dict(critic_ranks=run.critic_ranks * k)) for k in (2, 4, 8, 16)]
    if not run.offload:
        out.append(("offload", "offload weights, grads and optimizer states to host (FSDP2 CPUOffloadPolicy)",
                    dict(offload=True)))
    for role in ("rollout", "reference", "critic"):
        if role in run.colocated:
            out.append((f"own-{role}", f"{role} on GPUs of its own (not colocated with the trainer)",
                        dict(colocated=tuple(r for r in run.colocated if r != role))))
    out += longctx.long_context_candidates(run)
    if _engine_shards(run):
        out += [("util", f"rollout.gpu_memory_utilization={u:.2f}", dict(gpu_memory_utilization=u))
                for u in (0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2) if u < run.gpu_memory_utilization]
        out += [("tp", f"rollout tensor parallelism {run.engine_tp * k}", dict(engine_tp=run.engine_tp * k))
                for k in (2, 4, 8)]
        out += [("engines", f"rollout.num_workers={e} (fewer engines per GPU)", dict(engines=e))
                for e in _halvings(run.engines, 1)]
    return out


def _not_yet(run: RunShape, changes: dict) -> str:
    """A note when a change needs what rl-orch's trainer or engines cannot do yet (the plan is still right
    for systems that can: FSDP CPU offload; every long-sequence remedy of longctx.py runs)."""
    after = dataclasses.replace(run, **changes)
    missing = [what for what, on in (("CPU offload", after.offload),) if on]
    return f" [not in rl-orch yet: {', '.join(missing)}]" if missing else ""


def _halvings(value: int, floor: int) -> list:
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def suggestions(model: ModelShape, run: RunShape, device_bytes: Optional[int], host_bytes: Optional[int] = None,
                limit: int = 6) -> list:
    """Changes that make the plan fit: the mildest fitting option of each kind (micro-batch size,
    checkpointing, LoRA, more FSDP shards, offload, context parallelism, FP8 training, FP8 rollouts, own
    GPUs, lower engine utilisation, tensor parallelism, fewer engines), else pairs of two kinds. Each line names the config change and the
    largest device total it gives; [] when nothing tried fits."""
    cands = _candidates(run)
    before = plan_memory(model, run, device_bytes, host_bytes, suggest=False)
    failing = {d.name.split(" (")[0] for d in before.devices if d.fits is False}

    def fits(*changes) -> Optional[str]:
        merged = {k: v for _, _, c in changes for k, v in c.items()}
        plan = plan_memory(model, dataclasses.replace(run, **merged), device_bytes, host_bytes, suggest=False)
        if not plan.fits:
            return None
        shown = [d for d in plan.devices if d.name.split(" (")[0] in failing] or plan.devices
        where = ", ".join(f"{d.name.split(' (')[0]} {d.used_bytes / GIB:.1f} GiB" for d in shown)
        return f"{' + '.join(c[1] for c in changes)}: fits ({where}){_not_yet(run, merged)}"

    kinds = list(dict.fromkeys(k for k, _, _ in cands))
    out = []
    for kind in kinds:
        line = next((r for c in cands if c[0] == kind for r in [fits(c)] if r), None)
        if line:
            out.append(line)
    if out:
        return out[:limit]
    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            if len(out) >= limit:
                return out
            pair = [(x, y) for x in cands if x[0] == a for y in cands if y[0] == b]
            line = next((r for x, y in pair for r in [fits(x, y)] if r), None)
            if line:
                out.append(line)
    return out[:limit]


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def format_plan(plan: MemoryPlan) -> str:
    """Plain-text report: the model and run, a table of GiB per role instance by component, one line per
    device (used of available, fits / DOES NOT FIT / not checked), problems, suggestions."""
    m, r = plan.model, plan.run
    mb = f"packed rows of {r.packing_tokens} tokens" if r.packing_tokens else \
        f"{r.micro_batch_size} x {r.seq_len} tokens ({r.response_len} scored)"
    lines = [f"model {m.name}: {m.num_params / 1e9:.3g}e9 parameters ({m.active_params / 1e9:.3g}e9 active), "
             f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads / {m.kv_heads} KV heads, vocab {m.vocab}",
             f"run: {r.algorithm} on {r.device}, {r.precision}, {r.trainer_ranks} trainer rank(s), micro-batch "
             f"{mb}, checkpointing {'on' if r.gradient_checkpointing else 'off'}, "
             f"LoRA {'rank ' + str(r.lora_rank) if r.lora_rank else 'off'}, {r.attention} attention{longctx.describe(r)}", ""]
    rows = [("role", "device", "n", *COLUMNS, "total")]
    for role in plan.roles:
        rows.append((role.role, role.device, str(role.count), *(_gib(role.parts.get(c, 0)) for c in COLUMNS),
                     _gib(role.total)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    lines += ["(GiB per instance: one trainer rank, one engine shard)", ""]
    for d in plan.devices:
        verdict = {True: "fits", False: "DOES NOT FIT", None: "not checked (size unknown)"}[d.fits]
        size = f" of {_gib(d.device_bytes)}" if d.device_bytes is not None else ""
        lines.append(f"{d.name}: {' + '.join(d.roles)}: {_gib(d.used_bytes)}{size} GiB: {verdict}")
        lines += [f"  ! {p}" for p in d.problems]
    if not plan.fits:
        head = "changes that would make it fit:" if plan.suggestions else "no single or paired change tried fits"
        lines += ["", head]
        lines += [f"  - {s}" for s in plan.suggestions]
    return "\n".join(lines)
