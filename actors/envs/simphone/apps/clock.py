"""Clock: a list of alarms (time, label, on/off switch) and an editor to add one."""

from __future__ import annotations

import re

from actors.envs.simphone.data import WORDS
from actors.envs.simphone.ui import Page, PageView, button, switch, text_field

NAME = "Clock"
_TIME = re.compile(r"^\s*(\d{1,2})(?::(\d{2}))?\s*(am|pm)?\s*$", re.IGNORECASE)


def normalize_time(text: str) -> str | None:
    """'3pm', '3:00 pm', '15:00' -> '15:00'; None when it is not a time."""
    m = _TIME.match(text)
    if not m:
        return None
    hour, minute, half = int(m.group(1)), int(m.group(2) or 0), (m.group(3) or "").lower()
    if half:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    return f"{hour:02d}:{minute:02d}"


def init_state(rng) -> dict:
    alarms = []
    for _ in range(int(rng.integers(0, 4))):
        alarms.append(
            {
                "time": f"{int(rng.integers(5, 10)):02d}:{int(rng.choice([0, 15, 30, 45])):02d}",
                "label": str(rng.choice(WORDS)).capitalize(),
                "enabled": bool(rng.integers(2)),
            }
        )
    return {"alarms": alarms}


def root() -> Page:
    return Page("alarms")


def view(phone, page: Page) -> PageView:
    alarms = phone.state["clock"]["alarms"]
    if page.name == "alarms":

        def toggler(alarm):
            return lambda: alarm.update(enabled=not alarm["enabled"])

        items = [switch(f"{a['time']} {a['label']}".strip(), a["enabled"], toggler(a)) for a in alarms]
        return PageView(
            "Alarm", items=items, footer=[button("Add alarm", lambda: phone.push(Page("new_alarm")))]
        )

    def save():
        time = normalize_time(page.fields.get("time", ""))
        if time is not None:
            alarms.append({"time": time, "label": page.fields.get("label", "").strip(), "enabled": True})
            phone.pop()

    return PageView(
        "New alarm",
        header=[text_field(page, "time", "Time (e.g. 7:30 or 3pm)"), text_field(page, "label", "Label")],
        footer=[button("Cancel", phone.pop), button("Save", save)],
        on_enter=save,
    )
