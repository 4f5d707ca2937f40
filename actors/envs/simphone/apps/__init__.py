"""SimPhone's apps; `default_apps()` is the set a phone ships with."""

from __future__ import annotations

from actors.envs.simphone.apps import browser, calendar, clock, contacts, messages, notes, settings
from actors.envs.simphone.apps.distractor import DistractorApp


def default_apps() -> dict:
    apps = {m.NAME: m for m in (settings, clock, contacts, messages, browser, calendar, notes)}
    for name, labels in {
        "Camera": ("Shutter", "Switch camera", "Gallery", "Video"),
        "Photos": ("Search photos", "Library", "Sharing", "Memories"),
        "Maps": ("Search here", "Directions", "Explore", "Saved"),
        "YouTube": ("Search YouTube", "Shorts", "Subscriptions", "Library"),
        "Gmail": ("Search in mail", "Compose", "Inbox", "Sent"),
    }.items():
        apps[name] = DistractorApp(name, labels)
    return apps
