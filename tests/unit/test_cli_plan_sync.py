"""`rl-orch plan sync` through orchestrator.cli.main: the table, the auto mark and exit codes."""
import json

import pytest

from orchestrator.cli import build_parser, main
from orchestrator.cli.plan_sync import format_sync_table
from orchestrator.weight_sync import choose_strategy, predict_sync, setup_from_fabric, priced_names

STRATEGIES = priced_names()  # the strategies with a predictor


def _rows(out: str) -> dict[str, list[str]]:
    """strategy -> the row's cells (the leading '*' dropped), from the printed table."""
    rows = {}
    for line in out.splitlines():
        cells = line.replace("*", " ").split()
        if cells and cells[0] in STRATEGIES and len(cells) == 8:
            rows[cells[0]] = cells
    return rows


def _marked(out: str) -> str:
    return next(line.split()[1] for line in out.splitlines() if line.startswith("*  "))


def test_plan_sync_70b_table(capsys):
    rc = main(["plan", "sync", "--model", "llama3-70b", "--engines", "8", "--gpus-per-engine", "8",
               "--engine-nodes", "8", "--inter", "ib400"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = _rows(out)
    assert set(rows) == set(STRATEGIES)
    assert float(rows["nccl"][1]) >= 141.1e9 / 50e9  # at least the wire time
    assert _marked(out) == "nccl" and "auto -> nccl" in out
    eff = float(rows["nccl"][3])
    assert eff == pytest.approx(141.107 / float(rows["nccl"][1]), rel=1e-2)


@pytest.mark.parametrize("model", ["qwen2.5-7b", "llama3-8b", "llama3-70b", "qwen3-235b-a22b"])
def test_presets_print(capsys, model):
    assert main(["plan", "sync", "--model", model, "--engines", "2", "--gpus-per-engine", "4"]) == 0
    out = capsys.readouterr().out
    assert model in out and set(_rows(out)) == set(STRATEGIES)


def test_params_and_auto_delta_on_slow_ethernet(capsys):
    rc = main(["plan", "sync", "--params", "7e9", "--engines", "4", "--engine-nodes", "4", "--intra", "pcie4",
               "--inter", "eth25", "--changed-fraction", "0.03"])
    out = capsys.readouterr().out
    assert rc == 0 and _marked(out) == "delta"
    expected = predict_sync(setup_from_fabric(7e9, 2, 4, 1, 4, intra="pcie4", inter="eth25",
                                              changed_fraction=0.03))
    assert float(_rows(out)["delta"][1]) == pytest.approx(expected["delta"].seconds, abs=1e-3)


def test_model_folder(tmp_path, capsys):
    cfg = dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["plan", "sync", "--model", str(tmp_path), "--dtype", "fp32", "--intra", "loopback"]) == 0
    assert "0.538 GB" in capsys.readouterr().out  # 134,515,008 params * 4 bytes


def test_format_sync_table_marks_the_choice():
    s = setup_from_fabric(8e9, 2, 2, 1, 1)
    text = format_sync_table(s, predict_sync(s), "disk", label="x")
    assert _marked(text) == "disk" and set(_rows(text)) == set(STRATEGIES)
    assert text.splitlines()[0].startswith("weight sync x: 16 GB")
    assert choose_strategy(s) in text


@pytest.mark.parametrize("argv,option", [
    (["--params", "7e9", "--engines", "0"], "--engines"),
    (["--params", "7e9", "--gpus-per-engine", "-1"], "--gpus-per-engine"),
    (["--params", "7e9", "--engine-nodes", "3"], "--engine-nodes"),
    (["--params", "7e9", "--changed-fraction", "2"], "--changed-fraction"),
    (["--params", "7e9", "--inter", "carrier-pigeon"], "--inter"),
    (["--params", "7e9", "--intra", "nvlink9"], "--intra"),
    (["--params", "7e9", "--fs-read-gbps", "0"], "--fs-read-gbps"),
    (["--params", "7e9", "--bucket-mb", "-5"], "--bucket-mb"),
    (["--params", "7e9", "--load-gbps", "0"], "--load-gbps"),
    (["--params", "seven"], "--params"),
    (["--params", "0"], "--params"),
    (["--model", "no-such-model"], "--model"),
    (["--params", "7e9", "--dtype", "int3"], "--dtype"),
    (["--params", "7e9", "--engines", "two"], "--engines"),
    (["--params", "7e9", "--model", "llama3-8b"], "--model"),
    ([], "--model"),
])
def test_bad_input_exits_2_naming_the_option(capsys, argv, option):
    assert main(["plan", "sync", *argv]) == 2
    captured = capsys.readouterr()
    assert option in captured.err and captured.out == ""


def test_run_still_parses_and_help_exits_0(capsys):
    args = build_parser().parse_args(["run", "configs/x.yaml", "rollout.n=8"])
    assert args.config == "configs/x.yaml" and args.overrides == ["rollout.n=8"]
    assert main(["--help"]) == 0
    assert main(["plan", "--help"]) == 0
    assert "sync" in capsys.readouterr().out
    assert main(["plan"]) == 2  # `plan` needs a <what>
