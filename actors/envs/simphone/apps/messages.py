"""Messages: conversations and a compose screen (recipient, text, Send)."""

from __future__ import annotations

from actors.envs.simphone.ui import Page, PageView, button, row, text_field

NAME = "Messages"


def init_state(rng) -> list[dict]:
    return []


def root() -> Page:
    return Page("inbox")


def view(phone, page: Page) -> PageView:
    sent = phone.state["messages"]
    if page.name == "inbox":
        threads = sorted({m["to"] for m in sent})
        items = [row(name, lambda n=name: phone.push(Page("compose", fields={"to": n}))) for name in threads]
        return PageView(
            "Messages", items=items, footer=[button("Start chat", lambda: phone.push(Page("compose")))]
        )

    def send():
        to, text = page.fields.get("to", "").strip(), page.fields.get("text", "").strip()
        if to and text:
            sent.append({"to": to, "text": text})
            page.fields["text"] = ""

    thread = [row(m["text"]) for m in sent if m["to"] == page.fields.get("to", "").strip()]
    return PageView(
        "New conversation",
        header=[text_field(page, "to", "To: name or number")],
        items=thread,
        footer=[text_field(page, "text", "Text message"), button("Send", send, width_share=0.4)],
    )
