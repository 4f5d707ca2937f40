"""Settings: Wi-Fi, airplane mode (Network & internet), Bluetooth (Connected devices), dark theme and
brightness (Display), among distractor sections in a per-episode order that may need scrolling."""

from __future__ import annotations

from actors.envs.simphone.ui import Page, PageView, button, row, switch

NAME = "Settings"
SECTIONS = (
    "Network & internet", "Connected devices", "Display", "Battery", "Storage", "Sound & vibration",
    "Apps", "Notifications", "Security & privacy", "Location", "Accessibility", "System", "About phone",
)  # fmt: skip
BRIGHTNESS_LEVELS = (0, 25, 50, 75, 100)


def init_state(rng) -> dict:
    return {
        "wifi": bool(rng.integers(2)),
        "bluetooth": bool(rng.integers(2)),
        "airplane_mode": False,
        "dark_theme": bool(rng.integers(2)),
        "brightness": int(rng.choice(BRIGHTNESS_LEVELS)),
    }


def root() -> Page:
    return Page("main")


def view(phone, page: Page) -> PageView:
    st = phone.state["settings"]

    def toggle(key: str):
        def flip():
            st[key] = not st[key]

        return flip

    if page.name == "main":
        items = [
            row(name, lambda n=name: phone.push(Page("section", {"name": n})))
            for name in phone.shuffled("settings.sections", list(SECTIONS))
        ]
        for item in items:
            item.height = 190  # two-line rows: the section list is longer than the screen
        return PageView(
            "Settings", items=items, header=[row("Search settings", lambda: None, rid="search_bar")]
        )
    if page.name == "brightness":
        items = [button(f"{level}%", lambda v=level: st.update(brightness=v)) for level in BRIGHTNESS_LEVELS]
        return PageView("Brightness level", items=[row(f"Brightness {st['brightness']}%"), *items])
    section = page.args["name"]
    if section == "Network & internet":
        items = [
            switch("Wi-Fi", st["wifi"], toggle("wifi")),
            row("Mobile network", lambda: None),
            switch("Airplane mode", st["airplane_mode"], toggle("airplane_mode")),
            row("Hotspot & tethering", lambda: None),
        ]
    elif section == "Connected devices":
        items = [
            switch("Bluetooth", st["bluetooth"], toggle("bluetooth")),
            row("Pair new device", lambda: None),
        ]
    elif section == "Display":
        items = [
            row(f"Brightness level {st['brightness']}%", lambda: phone.push(Page("brightness"))),
            switch("Dark theme", st["dark_theme"], toggle("dark_theme")),
            row("Screen timeout", lambda: None),
        ]
    else:
        items = [row(f"{section} details", lambda: None)]
    return PageView(section, items=items)
