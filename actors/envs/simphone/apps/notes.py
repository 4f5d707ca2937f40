"""Notes: a list of notes and an editor."""

from __future__ import annotations

from actors.envs.simphone.ui import Page, PageView, button, row, text_field

NAME = "Notes"


def init_state(rng) -> list[dict]:
    return []


def root() -> Page:
    return Page("list")


def view(phone, page: Page) -> PageView:
    notes = phone.state["notes"]
    if page.name == "list":
        return PageView(
            "Notes",
            items=[row(n["text"]) for n in notes],
            footer=[button("New note", lambda: phone.push(Page("edit")))],
        )

    def save():
        text = page.fields.get("text", "").strip()
        if text:
            notes.append({"text": text})
            phone.pop()

    return PageView(
        "New note", header=[text_field(page, "text", "Write a note")], footer=[button("Save", save)]
    )
