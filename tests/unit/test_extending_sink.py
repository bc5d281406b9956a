"""The metric-sink worked example (docs/examples/csv_sink.py) through the run's own sink building:
`metrics.sinks` by dotted path and by a registry line; a resume drops the replayed steps."""
from __future__ import annotations

import csv

import pytest

from docs.examples.csv_sink import COLUMNS, CsvSink
from orchestrator.config import ConfigError, load_config
from orchestrator.metrics import JsonlLogger, SinkContext, read_jsonl, registry

ROWS = [{"step": 1, "reward/mean": 0.25, "actor/loss": 0.1, "timing/step_s": 3.0},
        {"step": 2, "reward/mean": 0.5, "actor/loss": None, "timing/step_s": 2.5},
        {"step": 3, "reward/mean": 0.75, "timing/step_s": 2.0}]


def _run_rows(cfg, out, rows, start_step=0):
    with registry.build_sinks(cfg, SinkContext(out, "t", 3, start_step)) as sinks:
        for r in rows:
            sinks.log_row(dict(r))
    return sinks


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_sink_by_dotted_path_gets_every_row(tmp_path):
    cfg = load_config(None, ["metrics.sinks=[jsonl, 'docs.examples.csv_sink:CsvSink']", "run.progress=false"])
    sinks = _run_rows(cfg, tmp_path, ROWS)
    assert [type(s).__name__ for s in sinks] == ["JsonlLogger", "CsvSink"]
    lines = _csv(tmp_path / "metrics.csv")
    assert tuple(lines[0]) == COLUMNS
    assert lines[1] == ["1", "0.25", "0.1", "", "", "3.0"] and lines[2][2] == ""  # None: an empty cell
    assert [line[0] for line in lines[1:]] == ["1", "2", "3"]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]  # every sink got every row


def test_a_resume_drops_the_replayed_steps(tmp_path):
    cfg = load_config(None, ["metrics.sinks=[jsonl, 'docs.examples.csv_sink:CsvSink']"])
    _run_rows(cfg, tmp_path, ROWS)
    _run_rows(cfg, tmp_path, [dict(ROWS[2], **{"reward/mean": 0.9})], start_step=2)  # resumed after step 2
    lines = _csv(tmp_path / "metrics.csv")
    assert [line[0] for line in lines[1:]] == ["1", "2", "3"] and lines[3][1] == "0.9"
    assert [r["reward/mean"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0.25, 0.5, 0.9]


def test_a_registry_line_makes_it_built_in(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.SINKS, "csv", "docs.examples.csv_sink:CsvSink")  # the line SINKS would get
    cfg = load_config(None, ["metrics.sinks=[console, jsonl, csv]", "run.progress=false"])
    sinks = _run_rows(cfg, tmp_path, ROWS[:1])
    assert isinstance(sinks.find(CsvSink), CsvSink) and isinstance(sinks.find(JsonlLogger), JsonlLogger)
    assert len(_csv(tmp_path / "metrics.csv")) == 2


def test_an_error_reaches_every_sink_and_every_sink_is_closed(tmp_path):
    seen = []

    class Spy(CsvSink):
        def on_error(self, exc):
            seen.append(type(exc).__name__)

    cfg = load_config(None, ["metrics.sinks=[jsonl]"])
    sinks = registry.build_sinks(cfg, SinkContext(tmp_path, "t", 3))
    sinks.sinks.append(Spy(tmp_path / "x.csv"))
    with pytest.raises(RuntimeError, match="boom"):
        with sinks:
            sinks.log_row(ROWS[0])
            raise RuntimeError("boom")
    assert seen == ["RuntimeError"] and sinks.sinks[-1]._file.closed


@pytest.mark.parametrize("sinks, message", [
    ("[jsonl, nope]", r"metrics.sinks: unknown sink 'nope'; registered: \['console', 'jsonl', 'prometheus'\]"),
    ("[jsonl, 'no_such_pkg.mod:Sink']", "metrics.sinks: sink 'no_such_pkg.mod:Sink': cannot import module 'no_such_pkg.mod'"),
    ("[jsonl, 'orchestrator.metrics.sink:SinkContext']", "is not a MetricSink subclass"),
    ("[console]", "'jsonl' is required"),
    ("[jsonl, console, jsonl]", r"\['jsonl'\] listed more than once"),
])
def test_bad_sinks_are_refused_naming_the_key(sinks, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"metrics.sinks={sinks}"])


def test_both_dotted_spellings_resolve_and_a_failed_sink_closes_the_others(tmp_path):
    assert registry.resolve_sink("docs.examples.csv_sink.CsvSink") is CsvSink
    assert registry.resolve_sink("docs.examples.csv_sink:CsvSink") is CsvSink
    closed = []

    class Made(CsvSink):
        def close(self):
            closed.append(True)
            super().close()

    class Broken(CsvSink):
        @classmethod
        def from_config(cls, cfg, ctx):
            raise ValueError("metrics.broken: bad setting")

    cfg = type("Cfg", (), {"metrics": type("M", (), {"sinks": ["made", "broken"]})()})()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.SINKS, "made", Made)
        mp.setitem(registry.SINKS, "broken", Broken)
        mp.setattr(Made, "from_config", classmethod(lambda cls, c, ctx: cls(tmp_path / "m.csv")))
        with pytest.raises(ValueError, match="bad setting"):
            registry.build_sinks(cfg, SinkContext(tmp_path, "t", 1))
    assert closed == [True]
