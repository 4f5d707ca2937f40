"""Value pools SimPhone draws from: people, words, products, sites. Everything ships in the repo."""

FIRST_NAMES = (
    "Ada", "Alan", "Grace", "Linus", "Margaret", "Dennis", "Barbara", "Ken", "Frances", "Edsger",
    "Radia", "Tim", "Katherine", "Donald", "Shafi", "John", "Lynn", "Niklaus", "Sophie", "Guido",
)  # fmt: skip
LAST_NAMES = (
    "Lovelace", "Turing", "Hopper", "Torvalds", "Hamilton", "Ritchie", "Liskov", "Thompson", "Allen",
    "Dijkstra", "Perlman", "Berners", "Johnson", "Knuth", "Goldwasser", "McCarthy", "Conway", "Wirth",
)  # fmt: skip
WORDS = (
    "hello", "milk", "meeting", "pizza", "tokyo", "weather", "groceries", "football", "jazz", "coffee",
    "dentist", "birthday", "flight", "laundry", "yoga", "budget", "concert", "library", "taxes", "garden",
)  # fmt: skip
SHOP_SITES = ("newegg.com", "bestbuy.com", "ebay.com", "walmart.com", "costco.com")
PRODUCTS = (
    ("MacBook Air 13", 999.0), ("MacBook Pro 14", 1599.0), ("Dell XPS 13", 1099.0), ("Logitech MX Master 3", 99.0),
    ("Razer DeathAdder", 49.0), ("Samsung 980 Pro SSD", 129.0), ("Corsair K70 Keyboard", 139.0),
    ("Sony WH-1000XM5", 349.0), ("Bose QuietComfort 45", 279.0), ("Apple AirPods Pro", 249.0),
    ("Nintendo Switch", 299.0), ("PlayStation 5", 499.0), ("Xbox Series X", 499.0), ("iPad Air", 599.0),
    ("Kindle Paperwhite", 139.0), ("LG UltraGear Monitor", 299.0), ("HP LaserJet Printer", 179.0),
    ("Anker Power Bank", 39.0), ("GoPro HERO12", 399.0), ("Canon EOS R50", 679.0),
)  # fmt: skip
SEARCH_TOPICS = (
    "news in Chile", "weather in Paris", "best pizza near me", "how to cook rice", "world cup results",
    "cheap flights to Tokyo", "latest iPhone", "jazz concerts", "stock market today", "python tutorial",
)  # fmt: skip
WEBSITES = ("wikipedia.org", "bbc.com", "cnn.com", "github.com", "nytimes.com", "espn.com")
