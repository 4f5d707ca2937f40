"""Apps that exist to be opened by mistake: a few buttons that do nothing a task cares about."""

from __future__ import annotations

from actors.envs.simphone.ui import Page, PageView, button, row


class DistractorApp:
    def __init__(self, name: str, labels: tuple[str, ...]):
        self.NAME = name
        self.labels = labels

    def init_state(self, rng) -> dict:
        return {"opened": False}

    def root(self) -> Page:
        return Page("main")

    def view(self, phone, page: Page) -> PageView:
        phone.state[self.NAME.lower()]["opened"] = True
        items = [row(label, lambda: None) for label in self.labels[1:]]
        return PageView(self.NAME, items=items, footer=[button(self.labels[0], lambda: None)])
