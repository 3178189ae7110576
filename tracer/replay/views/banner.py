"""The guidance banner: a lesson's or demo's "Look for" text and loader warnings (a truncated
trace), shown inside the replay because the full-screen app covers anything printed before it.
`x` or a click hides it. In predict mode the "Look for" text, which tells what the step that
matters does, waits until the first answer (show_guide)."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.widgets import Static

from tracer.i18n import N_, _

WARNING_STYLE = "bold #ffd23f"
GUIDE_STYLE = "bold #2ec4b6"
WITHHELD = N_("→ asks what the next step, the one that matters, will do; its Look-for text follows your answer.")


class Banner(Static):
    def __init__(self, guide: str = "", warnings: tuple[str, ...] = (), predict: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.guide = guide
        self.warnings = warnings
        self.withheld = predict and bool(guide)

    def on_mount(self) -> None:
        self.display = bool(self.guide or self.warnings)
        if self.display:
            self.update(self.banner_text())

    def banner_text(self) -> Text:
        lines = []
        for warning in self.warnings:
            lines.append(Text.assemble(("⚠ ", WARNING_STYLE), warning))
        if self.withheld:
            lines.append(Text.assemble((_("Predict: "), GUIDE_STYLE), _(WITHHELD)))
        elif self.guide:
            lines.append(Text.assemble((_("Look for: "), GUIDE_STYLE), self.guide))
        lines[-1].append("  " + _("(x hides this)"), "dim")
        return Text("\n").join(lines)

    def show_guide(self) -> None:
        """The "Look for" text, once predict mode's first answer is in."""
        if self.withheld:
            self.withheld = False
            self.update(self.banner_text())

    def hide(self) -> None:
        self.display = False

    def on_click(self, event: events.Click) -> None:
        self.hide()
