"""Calendar: upcoming events and a form to create one (title, date, time)."""

from __future__ import annotations

from actors.envs.simphone.apps.clock import normalize_time
from actors.envs.simphone.ui import Page, PageView, button, row, text_field

NAME = "Calendar"


def init_state(rng) -> dict:
    return {"events": []}


def root() -> Page:
    return Page("agenda")


def view(phone, page: Page) -> PageView:
    events = phone.state["calendar"]["events"]
    if page.name == "agenda":
        items = [row(f"{e['date']} {e['time']} {e['title']}") for e in events] or [row("No upcoming events")]
        return PageView(
            "Calendar", items=items, footer=[button("New event", lambda: phone.push(Page("new_event")))]
        )

    def save():
        title = page.fields.get("title", "").strip()
        time = normalize_time(page.fields.get("time", "")) if page.fields.get("time") else ""
        if title and time is not None:
            events.append({"title": title, "date": page.fields.get("date", "").strip(), "time": time})
            phone.pop()

    return PageView(
        "New event",
        header=[
            text_field(page, "title", "Title"),
            text_field(page, "date", "Date (e.g. May 3)"),
            text_field(page, "time", "Time"),
        ],
        footer=[button("Cancel", phone.pop), button("Save", save)],
    )
