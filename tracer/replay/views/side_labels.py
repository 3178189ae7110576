"""How `--compare` names its two sides (the replay's compare panel, its KV pages' titles and the
HTML export's title): each by its file, since two runs of one engine share the engine's name, then
what tells them apart: the engines when they differ (nanoengine 0.1.0 vs vllm 0.33.0), and each
config value that differs (num_kv_blocks 24 vs 48). Textual-free: the HTML export imports it.

    side_labels(a, b) -> (label A, label B, differences)     a, b: the two traces
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracer.i18n import _
from tracer.trace.diff import engine_label


def side_labels(a: Any, b: Any) -> tuple[str, str, str]:
    """Each trace's file name (the parent folder too when the names are equal), and what differs
    between the two runs: the engines, then each config value ('num_kv_blocks 24 vs 48')."""
    name_a, name_b = file_name(a), file_name(b)
    if name_a == name_b:
        name_a, name_b = file_name(a, parents=1), file_name(b, parents=1)
    differences = []
    if engine_label(a) != engine_label(b):
        differences.append(_("{a} vs {b}").format(a=engine_label(a), b=engine_label(b)))
    config_a, config_b = a.header.get("config") or {}, b.header.get("config") or {}
    for key in sorted(set(config_a) | set(config_b)):
        if config_a.get(key) != config_b.get(key):
            differences.append(
                _("{key} {a} vs {b}").format(key=key, a=config_a.get(key, "–"), b=config_b.get(key, "–"))
            )
    return name_a, name_b, ", ".join(differences) or _("same engine and config")


def file_name(trace: Any, parents: int = 0) -> str:
    path = Path(str(getattr(trace, "path", "trace")))
    return "/".join([*path.parent.parts[len(path.parent.parts) - parents :], path.name]) if parents else path.name
