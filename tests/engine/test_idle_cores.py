"""The default torch thread count: only the cores other processes leave idle."""

from __future__ import annotations

import os

import torch
from conftest import make_tiny_engine, torch_threads

from nanoengine.loading.engine_parts import idle_cores


def test_a_busy_machine_gets_one_thread(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.5, 9.0, 8.0))
    with torch_threads(2):
        assert idle_cores() == 1
        make_tiny_engine()
        assert torch.get_num_threads() == 1


def test_a_quiet_machine_keeps_torch_s_choice(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.3, 0.1))
    with torch_threads(2):
        assert idle_cores() == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    with torch_threads(16):
        assert idle_cores() == 11
    with torch_threads(4):  # never more than torch (or the user) chose
        assert idle_cores() == 4


def test_an_explicit_thread_count_wins(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    with torch_threads(1):
        make_tiny_engine(num_threads=2)
        assert torch.get_num_threads() == 2
