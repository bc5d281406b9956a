"""Reward functions for integration tests on a random tiny model (accuracy would always be 0 there), and
`crashed_copy` for the resume tests, and small checks several tests share."""


def length_reward(completions: list[str], answers: list[str]) -> list[float]:
    """A varying, deterministic reward: the completion's length in characters, modulo 7, over 7."""
    return [(len(c) % 7) / 7.0 for c in completions]


def crashed_copy(whole_out, out, step: int) -> None:
    """What a run that died as step `step` + 1 began leaves behind, taken from the uninterrupted run of the same
    config in `whole_out` (seeded: its first `step` steps and its step-`step` checkpoint are what the crashed run
    would have written): `out/ckpt/step_<step>` and the metrics rows of steps 1..step. Saves the crashed run's
    start and steps; the resume from `out` is then compared with the rest of the uninterrupted run."""
    import json
    import shutil
    from pathlib import Path

    name = f"step_{step:06d}"
    shutil.copytree(Path(whole_out) / "ckpt" / name, Path(out) / "ckpt" / name)
    rows = [line for line in (Path(whole_out) / "metrics.jsonl").read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    (Path(out) / "metrics.jsonl").write_text("\n".join(rows) + "\n")


LOSS_KEYS = ("actor/entropy", "actor/clip_frac", "actor/clip_frac_low", "actor/clip_frac_high", "actor/clip_frac_dual",
             "actor/approx_kl_old", "actor/loss", "actor/grad_norm")


def assert_loss_metrics(rows: list[dict], mini_batches: int = 1) -> None:
    """Every row carries the metrics every policy loss reports (issue 19: entropy, clip fractions by side, dual-clip
    fraction, approximate KL to the old policy), finite; with 2+ mini-batches the later ones see a moved policy."""
    import math

    for row in rows:
        for key in LOSS_KEYS:
            assert key in row and math.isfinite(row[key]), key
        assert 0 < row["actor/entropy"] and row["actor/grad_norm"] > 0
        assert abs(row["actor/clip_frac_low"] + row["actor/clip_frac_high"] - row["actor/clip_frac"]) < 1e-9
    if mini_batches > 1:
        assert any(r["actor/approx_kl_old"] > 0 for r in rows)


def engine_cores(pid: int) -> list[int]:
    """The vLLM engine-core processes whose parent is `pid` (their command line reads VLLM::EngineCore)."""
    from pathlib import Path

    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid \
                    and b"EngineCore" in (proc / "cmdline").read_bytes():
                out.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return out
