"""Evaluators: the task's checks over the fake adb server, and the VLM judge against a fake HTTP endpoint."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from actors.envs.adb.config import JudgeConfig
from actors.envs.adb.device import AdbDevice
from actors.envs.adb.evaluator import (
    ChecksEvaluator,
    JudgeEvaluator,
    Verdict,
    make_evaluator,
    parse_yes_no,
)
from actors.envs.adb.tasks import bind, load_device_templates
from common.types import Observation, UIElement
from tests.fake_adb import FakeAdbServer, FakePhone, Screen, make_png

pytestmark = pytest.mark.timeout(60)

PNG = make_png(3, 2, (10, 200, 30))


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # never start a real adb server
    phone = FakePhone(screens={"home": Screen(b"<hierarchy/>", PNG)}, current="home")
    with FakeAdbServer(phone) as s:
        yield s


@pytest.fixture
def device(server):
    return AdbDevice(server.phone.serial, port=server.port, timeout=2)


def stock_task(tid: str, **values):
    (template,) = [t for t in load_device_templates("stock") if t.id == tid]
    return bind(template, {n: values.get(n, v["train"][0]) for n, v in template.params.items()})


OBS = Observation("x", (UIElement("android.widget.TextView", text="example.com"),))


# ---- checks ----


def test_checks_evaluator_on_stock_tasks(device, server):
    phone = server.phone
    evaluator = ChecksEvaluator(timeout=2.0)
    assert not evaluator.needs_screenshot

    dark = stock_task("settings.dark_mode_on")
    phone.handlers["cmd"] = lambda p, argv: (b"Night mode: no\n", b"", 0)
    assert evaluator.evaluate(device, dark, OBS, None) == Verdict(
        False, "`cmd uimode night` not equals 'Night mode: yes': 'Night mode: no'"
    )
    phone.handlers["cmd"] = lambda p, argv: (b"Night mode: yes\n", b"", 0)
    assert evaluator.evaluate(device, dark, OBS, None).success

    contacts: list[str] = []
    phone.handlers["content"] = lambda p, argv: (
        "".join(f"Row: {i} display_name={n}\n" for i, n in enumerate(contacts)).encode()
        or b"No result found.\n",
        b"",
        0,
    )
    add = stock_task("contacts.add_contact", name="Dana O'Neil")
    assert not evaluator.evaluate(device, add, OBS, None).success
    contacts.append("Dana O'Neil")
    verdict = evaluator.evaluate(device, add, OBS, None)
    assert verdict.success and "Dana O'Neil" in verdict.reason

    chrome = stock_task("chrome.open_site", site="example.com")
    focus = (
        b"  mCurrentFocus=Window{1 u0 com.android.chrome/org.chromium.chrome.browser.ChromeTabbedActivity}\n"
    )
    phone.handlers["dumpsys"] = lambda p, argv: (focus, b"", 0)
    assert evaluator.evaluate(device, chrome, OBS, None).success
    assert not evaluator.evaluate(device, chrome, Observation("x", ()), None).success

    airplane = stock_task("settings.airplane_mode", mode={"word": "on", "before": "disable", "value": "1"})
    assert not evaluator.evaluate(device, airplane, OBS, None).success
    phone.settings["global/airplane_mode_on"] = "1"
    assert evaluator.evaluate(device, airplane, OBS, None).success


# ---- the judge ----


class Judge:
    """A fake chat-completions endpoint on 127.0.0.1; `mode` says how it answers the next request."""

    def __init__(self):
        self.mode = "yes"
        self.closing = threading.Event()
        self.requests: list[tuple[dict, dict]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append((dict(self.headers), body))
                mode = owner.mode
                if mode == "slow" and owner.closing.wait(30.0):
                    return  # the client gave up long ago
                if mode == "http500":
                    self.send_error(500, "boom")
                    return
                if mode == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "http://127.0.0.1:1/steal")
                    self.end_headers()
                    return
                content = {"yes": "Yes.", "no": "**NO** - the switch is off", "garbage": "Maybe later"}.get(
                    mode
                )
                payload = (
                    b"not json"
                    if mode == "notjson"
                    else json.dumps(
                        {"choices": [{"message": {"role": "assistant", "content": content}}]}
                    ).encode()
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/chat/completions"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def judge(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    j = Judge()
    j.thread.start()
    yield j
    j.close()


def task():
    return stock_task("settings.auto_rotate_on")


def test_judge_yes_carries_instruction_image_model_and_token(judge, monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "s3cret")
    evaluator = JudgeEvaluator(
        JudgeConfig(url=judge.url, model="qwen-vl", api_key_env="JUDGE_TEST_KEY", timeout=5)
    )
    assert evaluator.needs_screenshot
    assert evaluator.evaluate(None, task(), OBS, PNG) == Verdict(True, "judge said YES")
    ((headers, body),) = judge.requests
    assert headers["Authorization"] == "Bearer s3cret"
    assert body["model"] == "qwen-vl"
    parts = body["messages"][-1]["content"]
    assert any(p["type"] == "text" and "Turn on auto-rotate screen" in p["text"] for p in parts)
    (image,) = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert image.startswith("data:image/png;base64,")
    assert base64.b64decode(image.split(",", 1)[1]) == PNG
    assert not evaluator.failures


def test_judge_no_token_without_the_env_var(judge, monkeypatch):
    monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    evaluator = JudgeEvaluator(JudgeConfig(url=judge.url, api_key_env="JUDGE_TEST_KEY", timeout=5))
    judge.mode = "no"
    assert evaluator.evaluate(None, task(), OBS, PNG) == Verdict(False, "judge said NO")
    assert "Authorization" not in judge.requests[0][0]


@pytest.mark.parametrize(
    ("mode", "cause"),
    [
        ("garbage", "unparsable"),
        ("http500", "http_error"),
        ("notjson", "bad_response"),
        ("redirect", "http_error"),
    ],
)
def test_judge_failures_are_counted_no(judge, mode, cause):
    evaluator = JudgeEvaluator(JudgeConfig(url=judge.url, timeout=5))
    judge.mode = mode
    verdict = evaluator.evaluate(None, task(), OBS, PNG)
    assert not verdict.success and cause in verdict.reason
    assert evaluator.failures == {cause: 1}
    assert len(judge.requests) == 1  # a redirect is not followed


def test_judge_timeout(judge):
    evaluator = JudgeEvaluator(JudgeConfig(url=judge.url, timeout=0.2))
    judge.mode = "slow"
    started = time.monotonic()
    verdict = evaluator.evaluate(None, task(), OBS, PNG)
    # It gives up at its timeout, long before the slow judge would answer (30 s), even on a busy machine.
    assert time.monotonic() - started < 10
    assert not verdict.success and evaluator.failures == {"timeout": 1}


def test_judge_without_screenshot_or_server():
    evaluator = JudgeEvaluator(JudgeConfig(url="http://127.0.0.1:1/v1/chat/completions", timeout=2))
    assert not evaluator.evaluate(None, task(), OBS, None).success
    assert not evaluator.evaluate(None, task(), OBS, b"GIF89a").success
    assert evaluator.failures == {"no_screenshot": 2}
    assert not evaluator.evaluate(None, task(), OBS, PNG).success
    assert evaluator.failures["unreachable"] == 1


@pytest.mark.parametrize("url", ["", "file:///etc/passwd", "ftp://host/x", "127.0.0.1:8000/v1", "http://"])
def test_judge_refuses_non_http_urls(url):
    with pytest.raises(ValueError, match="http"):
        JudgeEvaluator(JudgeConfig(url=url))


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ("YES", True),
        ("yes.", True),
        ("**Yes**, it is on", True),
        ("Answer: NO", False),
        ("no", False),
        ("The task is complete: yes", True),
        ("yesterday", None),
        ("I cannot say yes or no", None),
        ("", None),
    ],
)
def test_parse_yes_no(answer, verdict):
    assert parse_yes_no(answer) is verdict


def test_make_evaluator():
    assert isinstance(make_evaluator("checks", JudgeConfig(), 3.0), ChecksEvaluator)
    assert make_evaluator("checks", JudgeConfig(), 3.0).timeout == 3.0
    assert isinstance(
        make_evaluator("judge", JudgeConfig(url="https://judge.example/v1"), 3.0), JudgeEvaluator
    )
    with pytest.raises(ValueError, match=r"--adb\.judge\.url"):
        make_evaluator("judge", JudgeConfig(), 3.0)
    with pytest.raises(ValueError, match=r"checks.*judge"):
        make_evaluator("vibes", JudgeConfig(), 3.0)
