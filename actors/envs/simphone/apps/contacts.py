"""Contacts: an alphabetical list longer than the screen, a detail page, and a form to add or edit."""

from __future__ import annotations

from actors.envs.simphone.data import FIRST_NAMES, LAST_NAMES
from actors.envs.simphone.ui import Page, PageView, button, row, text_field

NAME = "Contacts"


def init_state(rng) -> list[dict]:
    people = set()
    target = int(rng.integers(14, 22))
    while len(people) < target:
        people.add(f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}")
    return [{"name": n, "phone": f"555-{int(rng.integers(0, 10000)):04d}"} for n in sorted(people)]


def root() -> Page:
    return Page("list")


def view(phone, page: Page) -> PageView:
    contacts = phone.state["contacts"]
    if page.name == "list":
        items = [
            row(c["name"], lambda c=c: phone.push(Page("detail", {"name": c["name"]})))
            for c in sorted(contacts, key=lambda c: c["name"])
        ]
        for item in items:
            item.height = 190  # rows with an avatar: the list is longer than the screen
        return PageView(
            "Contacts", items=items, footer=[button("Create contact", lambda: phone.push(Page("edit")))]
        )
    if page.name == "detail":
        contact = next((c for c in contacts if c["name"] == page.args["name"]), None)
        if contact is None:
            return PageView("Contact", items=[row("Contact not found")])

        def edit():
            phone.push(
                Page(
                    "edit",
                    {"name": contact["name"]},
                    fields={"name": contact["name"], "phone": contact["phone"]},
                )
            )

        return PageView(
            contact["name"],
            items=[row(contact["name"]), row(f"Mobile {contact['phone']}")],
            footer=[button("Call", lambda: None), button("Message", lambda: None), button("Edit", edit)],
        )

    def save():
        name = page.fields.get("name", "").strip()
        if not name:
            return
        number = page.fields.get("phone", "").strip()
        existing = next((c for c in contacts if c["name"] == page.args.get("name")), None)
        if existing is not None:
            existing.update(name=name, phone=number)
        else:
            contacts.append({"name": name, "phone": number})
        phone.pop()

    title = "Edit contact" if page.args.get("name") else "Create contact"
    return PageView(
        title,
        header=[text_field(page, "name", "Name"), text_field(page, "phone", "Phone")],
        footer=[button("Cancel", phone.pop), button("Save", save)],
    )
