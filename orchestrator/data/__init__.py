"""Datasets (built-in arithmetic task, JSONL, parquet), chat rendering and the stateful loader."""
from orchestrator.data.chat import render_prompt_ids, render_row
from orchestrator.data.datasets import DatasetError, load_examples
from orchestrator.data.loader import StatefulLoader
from orchestrator.data.tasks import Example, arithmetic_examples

__all__ = ["DatasetError", "Example", "StatefulLoader", "arithmetic_examples", "load_examples", "render_prompt_ids",
           "render_row"]
