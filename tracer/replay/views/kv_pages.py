"""The physical KV block pool as a grid, one cell per block, drawn line by line (only visible rows).

Cell (6 columns): owner letter, fill level of its block_size slots, then either the ref count when
the block is shared ('×2') or, for the selected sequence, the block's position in its block_table
(1, 2, 3 ...), then '◆' if KV slots were written into it this step ('⧉' if it is a copy-on-write
copy made this step, written too), then a gap. '·' is a free block, '○' a free block that still
holds hashed (cached) KV. Blocks that changed since the previous step are underlined; blocks
written this step also flash when animations are on. The top line lists the step's copies
(source→copy).
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from nanoengine.sequence import EventKind
from tracer.i18n import _
from tracer.replay.beams import COPY_MARK
from tracer.replay.colors import CACHED_GLYPH, CHANGED, FREE_GLYPH, fill_glyph, seq_color, seq_letter, seq_style
from tracer.trace.step_line import blocks_to_copy_of

CELL = 6
FREE_STYLE = Style(color="#6c6c6c")
CACHED_STYLE = Style(color="#b0b0b0", italic=True)
WRITTEN_STYLE = Style(bgcolor="#ffffff", color="black", bold=True)
LABEL_STYLE = Style(color="#8a8a8a")
SUMMARY_STYLE = Style(color="#d0d0d0")


def written_blocks(step: dict, block_size: int) -> set[int]:
    return {slot // block_size for slot in step.get("inputs", {}).get("slot_mapping", [])}


def block_state(pool: dict, block: int) -> tuple:
    """Everything the cell shows about one block, for 'changed since the previous step'."""
    return (
        tuple(pool["owners"][block]),
        pool["ref_counts"][block],
        pool["hashes"][block] is not None,
        pool["filled"][block],
    )


class KVPagesView(ScrollView, can_focus=True):
    """Whole block pool; click a block to select it (and its owner)."""

    class BlockClicked(Message):
        def __init__(self, block: int, owners: list[int]) -> None:
            super().__init__()
            self.block = block
            self.owners = owners

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step: dict = {}
        self.prev_pool: dict | None = None
        self.pool: dict = {
            "block_size": 1,
            "ref_counts": [],
            "hashes": [],
            "free_block_ids": [],
            "owners": [],
            "filled": [],
        }
        self.written: set[int] = set()
        self.copies: list[tuple[int, int]] = []  # the step's copy-on-write copies: (source, copy)
        self.selected_seq: int | None = None
        self.selected_block: int | None = None
        self.table_index: dict[int, int] = {}
        self.flash = False
        self.animations = True

    # ---- data -----------------------------------------------------------------------------
    def show(self, step: dict, prev: dict | None, header: dict) -> None:
        self.step = step
        self.pool = step["pool"]
        self.prev_pool = prev["pool"] if prev else None
        self.written = written_blocks(step, self.pool["block_size"])
        self.copies = blocks_to_copy_of(step)
        self.update_table_index()
        self.update_virtual_size()
        if self.animations and self.written and self.is_mounted:
            self.flash = True
            self.set_timer(0.5, self.end_flash)
        self.refresh()

    def end_flash(self) -> None:
        self.flash = False
        self.refresh()

    def select(self, seq_id: int | None, block: int | None = None) -> None:
        self.selected_seq, self.selected_block = seq_id, block
        self.update_table_index()
        self.refresh()

    def update_table_index(self) -> None:
        self.table_index = {}
        for seq in self.step.get("seqs", []):
            if seq["seq_id"] == self.selected_seq:
                # logical block index i (block_table[i]), counted from 0 like the lessons and the engine
                self.table_index = {block: i for i, block in enumerate(seq.get("block_table_after", []))}

    @property
    def num_kv_blocks(self) -> int:
        return len(self.pool["ref_counts"])

    def columns(self) -> int:
        return max(1, (self.scrollable_content_region.width - self.label_width()) // CELL)

    def label_width(self) -> int:
        return len(str(max(0, self.num_kv_blocks - 1))) + 1

    def update_virtual_size(self) -> None:
        rows = -(-self.num_kv_blocks // self.columns())
        self.virtual_size = Size(self.label_width() + self.columns() * CELL, rows + 1)

    def on_resize(self, event: events.Resize) -> None:
        self.update_virtual_size()

    # ---- rendering ------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y == 0:
            return Strip([Segment(set_cell_size(self.summary(), width), SUMMARY_STYLE)], width)
        row = y - 1 + self.scroll_offset.y
        cols = self.columns()
        first = row * cols
        if first >= self.num_kv_blocks:
            return Strip.blank(width)
        label = self.label_width()
        segments = [Segment(f"{first:>{label - 1}}│", LABEL_STYLE)]
        for block in range(first, min(first + cols, self.num_kv_blocks)):
            segments.extend(self.cell(block))
        return Strip(segments).extend_cell_length(width).crop(0, width)

    def summary(self) -> str:
        pool = self.pool
        if self.selected_block is not None and self.selected_block < self.num_kv_blocks:
            return self.block_details(self.selected_block)
        free = len(pool["free_block_ids"])
        cached = sum(1 for b in pool["free_block_ids"] if pool["hashes"][b] is not None)
        shared = sum(1 for r in pool["ref_counts"] if r > 1)
        parts = [  # most important first: a narrow panel drops from the end
            _("used {used}/{total}").format(used=self.num_kv_blocks - free, total=self.num_kv_blocks),
            _("free {count}").format(count=free),
            *self.copies_part(),
            _("written ◆{count}").format(count=len(self.written)),
            _("cached ○{count}").format(count=cached),
            _("shared {count}").format(count=shared),
        ]
        while len(parts) > 2 and cell_len(" · ".join(parts)) > self.scrollable_content_region.width:
            parts.pop()
        return " · ".join(parts)

    def copies_part(self) -> list[str]:
        """'copy-on-write ⧉ 1→2, 1→3': the shared blocks copied this step, each with its copy."""
        if not self.copies:
            return []
        pairs = ", ".join(f"{source}→{copy}" for source, copy in self.copies)
        return [_("copy-on-write {mark} {pairs}").format(mark=COPY_MARK, pairs=pairs)]

    def copy_details(self, block: int) -> str:
        """' · copy of block 1 (copy-on-write this step)', or of a source: ' · copied to block 2 ...'."""
        parts = [
            _("copy of block {source} (copy-on-write this step)").format(source=s) for s, c in self.copies if c == block
        ]
        parts += [
            _("copied to block {copy} this step (copy-on-write)").format(copy=c) for s, c in self.copies if s == block
        ]
        return "".join(" · " + part for part in parts)

    def block_details(self, block: int) -> str:
        pool = self.pool
        owners = ",".join(f"{seq_letter(s)}#{s}" for s in pool["owners"][block]) or _("free")
        block_hash = pool["hashes"][block]
        hashed = _("hash {hash}…").format(hash=f"{block_hash & 0xFFFF:04x}") if block_hash is not None else _("no hash")
        logical = (
            " · "
            + _("{seq}'s logical block {index}").format(
                seq=seq_letter(self.selected_seq), index=self.table_index[block]
            )
            if block in self.table_index and self.selected_seq is not None
            else ""
        )
        hit_now = [
            e["seq_id"]
            for e in self.step.get("events", [])
            if e["kind"] == EventKind.PREFIX_HIT and block in e["detail"].get("blocks", [])
        ]
        same_step = (
            " · " + _("written this step and hit in it by {seqs}").format(seqs=",".join(seq_letter(s) for s in hit_now))
            if hit_now and block in self.written
            else ""
        )
        filled = _("filled {filled}/{size}").format(filled=pool["filled"][block], size=pool["block_size"])
        return (
            _("block {block}: {owners}").format(block=block, owners=owners)
            + f"{logical} · ref_count {pool['ref_counts'][block]} · {filled} · {hashed}{same_step}"
            + self.copy_details(block)
        )

    def cell(self, block: int) -> list[Segment]:
        pool = self.pool
        owners, ref = pool["owners"][block], pool["ref_counts"][block]
        glyph = fill_glyph(pool["filled"][block], pool["block_size"])
        changed = self.prev_pool is not None and (
            block >= len(self.prev_pool["ref_counts"]) or block_state(pool, block) != block_state(self.prev_pool, block)
        )
        extra = CHANGED if changed else Style()
        if block == self.selected_block:
            extra += Style(reverse=True)
        if owners:
            owner = self.selected_seq if self.selected_seq is not None and self.selected_seq in owners else owners[0]
            if block in self.table_index:
                selected = seq_style(owner, selected=True) + extra
                body = [
                    Segment(seq_letter(owner), selected),
                    Segment(glyph, selected + Style(color="white")),
                    Segment(f"{self.table_index[block]:>2}"[-2:], selected),
                ]
            else:
                mark = (f"×{ref}" if ref < 10 else "×+") if ref > 1 else "  "
                body = [
                    Segment(seq_letter(owner), seq_style(owner, selected=True) + extra),
                    Segment(glyph, Style(color=seq_color(owner)) + extra),
                    Segment(mark, Style(bold=True) + extra),
                ]
        elif pool["hashes"][block] is not None:
            body = [Segment(CACHED_GLYPH + glyph + "  ", CACHED_STYLE + extra)]
        else:
            body = [Segment(FREE_GLYPH + "   ", FREE_STYLE + extra)]
        if self.flash and block in self.written:
            body = [Segment(seg.text, (seg.style or Style()) + WRITTEN_STYLE) for seg in body]
        copied = any(copy == block for _source, copy in self.copies)
        mark = f"{COPY_MARK} " if copied else ("◆ " if block in self.written else "  ")
        return body + [Segment(mark, Style(color="#ffffff", bold=True))]

    # ---- mouse ----------------------------------------------------------------------------
    def block_at(self, x: int, y: int) -> int | None:
        """Block under a content-relative cell, or None."""
        if y < 1 or x < self.label_width():
            return None
        col = (x - self.label_width()) // CELL
        if col >= self.columns() or (x - self.label_width()) % CELL >= CELL - 2:
            return None
        block = (y - 1 + self.scroll_offset.y) * self.columns() + col
        return block if block < self.num_kv_blocks else None

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        block = self.block_at(offset.x, offset.y)
        if block is not None:
            self.post_message(self.BlockClicked(block, list(self.pool["owners"][block])))
