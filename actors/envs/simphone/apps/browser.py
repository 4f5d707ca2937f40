"""Browser: an address bar that searches or opens sites, search results, tabs (incognito too), and the
shopping sites of Android-in-the-Wild's WebShopping tasks (search, scrolling results, sort, product
page, cart). The shop's state lives under the top-level `shop` key."""

from __future__ import annotations

import re

from actors.envs.simphone.data import PRODUCTS, SHOP_SITES, WEBSITES
from actors.envs.simphone.ui import Page, PageView, button, row, text_field

NAME = "Browser"
_DOMAIN = re.compile(
    r"^(?:https?://)?(?:www\.)?([a-z0-9-]+(?:\.[a-z0-9-]+)*\.(?:com|org|net|io|edu|gov))(?:/\S*)?$"
)
SORTS = {"relevance": "Relevance", "price_asc": "Price: low to high", "price_desc": "Price: high to low"}


def init_state(rng) -> dict:
    return {
        "url": "",
        "query": "",
        "history": [],
        "tabs": [{"url": "", "incognito": False}],
        "incognito": False,
    }


def init_extra_state(rng) -> dict:
    return {"shop": {"site": "", "query": "", "sort": "relevance", "results": [], "viewed": "", "cart": []}}


def root() -> Page:
    return Page("start")


def _products(phone, query: str, sort: str) -> list[tuple[str, float]]:
    """Products for a query: matches first (in a per-episode order), then the rest; or sorted by price."""
    words = set(query.lower().split())
    ordered = phone.shuffled("shop.catalog", list(PRODUCTS))
    hits = [p for p in ordered if words & set(p[0].lower().split())]
    rest = [p for p in ordered if p not in hits]
    found = hits + rest[: max(0, 12 - len(hits))]
    if sort == "price_asc":
        found.sort(key=lambda p: p[1])
    elif sort == "price_desc":
        found.sort(key=lambda p: -p[1])
    return found


def view(phone, page: Page) -> PageView:
    st, shop = phone.state["browser"], phone.state["shop"]

    def go(text: str) -> None:
        text = text.strip()
        if not text:
            return
        m = _DOMAIN.match(text.lower())
        if m:
            open_url(m.group(1))
        else:
            st["query"] = text
            st["history"].append(f"search: {text}")
            phone.push(Page("results", {"query": text}))

    def open_url(url: str) -> None:
        st["url"] = url
        st["history"].append(url)
        st["tabs"][-1]["url"] = url
        if url in SHOP_SITES:
            shop.update(site=url, query="", results=[], sort="relevance")
            phone.push(Page("shop_home", {"site": url}))
        else:
            phone.push(Page("site", {"url": url}))

    def new_tab(incognito: bool) -> None:
        st["tabs"].append({"url": "", "incognito": incognito})
        st["incognito"] = incognito
        phone.stacks[phone.app] = [Page("start")]

    address = text_field(page, "url", st["url"] or "Search or type URL", rid="com.android.chrome:id/url_bar")
    chrome_footer = [
        button("Menu", lambda: phone.push(Page("menu"))),
        button(f"Tabs {len(st['tabs'])}", lambda: None),
    ]
    submit = lambda: go(page.fields.get("url", ""))  # noqa: E731

    if page.name == "start":
        title = "New incognito tab" if st["incognito"] else "New tab"
        items = [
            row(site, lambda s=site: open_url(s))
            for site in phone.shuffled("browser.shortcuts", list(WEBSITES))
        ]
        return PageView(title, header=[address], items=items, footer=chrome_footer, on_enter=submit)
    if page.name == "menu":
        items = [
            row("New tab", lambda: new_tab(False)),
            row("New incognito tab", lambda: new_tab(True)),
            row("History", lambda: None),
            row("Bookmarks", lambda: None),
            row("Settings", lambda: None),
        ]
        return PageView("Menu", items=items)
    if page.name == "results":
        q = page.args["query"]
        sources = phone.shuffled(
            "browser.sources", ["Wikipedia", "BBC News", "Reuters", "YouTube", "Reddit", "The Guardian"]
        )
        items = [
            row(f"{q} - {src}", lambda s=src: open_url(f"{s.lower().replace(' ', '')}.com"))
            for src in sources
        ]
        return PageView(
            f"{q} - Google Search", header=[address], items=items, footer=chrome_footer, on_enter=submit
        )
    if page.name == "site":
        url = page.args["url"]
        items = [row(f"Welcome to {url}"), row("Top stories", lambda: None), row("Sign in", lambda: None)]
        return PageView(url, header=[address], items=items, footer=chrome_footer, on_enter=submit)
    return _shop_view(phone, page, shop, address, submit)


def _shop_view(phone, page: Page, shop: dict, address, submit) -> PageView:
    site = page.args.get("site", shop["site"])
    cart_button = button(f"Cart ({len(shop['cart'])})", lambda: phone.push(Page("cart", {"site": site})))

    def search() -> None:
        q = page.fields.get("q", "").strip()
        if q:
            shop.update(query=q, sort="relevance")
            shop["results"] = [name for name, _ in _products(phone, q, "relevance")]
            phone.push(Page("shop_results", {"site": site}))

    def open_product(name: str) -> None:
        shop["viewed"] = name
        phone.push(Page("product", {"site": site, "name": name}))

    if page.name == "shop_home":
        box = text_field(page, "q", f"Search {site}", rid="shop_search")
        deals = [
            row(f"Deal: {name} ${price:.0f}", lambda n=name: open_product(n))
            for name, price in phone.shuffled("shop.deals", list(PRODUCTS))[:4]
        ]
        return PageView(
            site,
            header=[address, box],
            items=deals,
            footer=[cart_button],
            on_enter=lambda: search() if page.focused == "q" else submit(),
        )
    if page.name == "shop_results":
        products = _products(phone, shop["query"], shop["sort"])
        items = [row(f"{name} ${price:.0f}", lambda n=name: open_product(n)) for name, price in products]
        for item in items:
            item.height = 260  # product cards: a result list longer than the screen
        sort_button = button(
            f"Sort by: {SORTS[shop['sort']]}", lambda: phone.push(Page("sort", {"site": site}))
        )
        return PageView(f"{shop['query']} - {site}", header=[sort_button], items=items, footer=[cart_button])
    if page.name == "sort":

        def choose(key: str) -> None:
            shop["sort"] = key
            shop["results"] = [name for name, _ in _products(phone, shop["query"], key)]
            phone.pop()

        return PageView(
            "Sort by", items=[row(label, lambda k=key: choose(k)) for key, label in SORTS.items()]
        )
    if page.name == "product":
        name = page.args["name"]
        price = dict(PRODUCTS)[name]

        def add() -> None:
            shop["cart"].append({"name": name, "price": price})

        items = [row(name), row(f"${price:.2f}"), row("Free shipping"), row("Customer reviews", lambda: None)]
        return PageView(name, items=items, footer=[button("Add to cart", add), cart_button])
    items = [row(f"{item['name']} ${item['price']:.0f}") for item in shop["cart"]] or [
        row("Your cart is empty")
    ]
    total = sum(item["price"] for item in shop["cart"])
    return PageView(
        "Cart", items=[*items, row(f"Subtotal ${total:.2f}")], footer=[button("Checkout", lambda: None)]
    )
