"""The one message every view posts when the user picks a sequence (click, arrow keys)."""

from __future__ import annotations

from textual.message import Message


class SeqSelected(Message):
    def __init__(self, seq_id: int) -> None:
        super().__init__()
        self.seq_id = seq_id
