"""Who decides that an episode on a device succeeded: the task's own checks, or a VLM judge.

Checks are exact and cheap but must be written per task; the judge needs only the instruction and a
screenshot, at the price of a model call and its mistakes. The judge never raises: any failure is a
"no" with the cause counted in `failures`, so a flaky endpoint costs reward, not the actor.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from actors.envs.adb.config import JudgeConfig
from actors.envs.adb.device import AdbDevice
from actors.envs.adb.tasks import DeviceTask, evaluate_check
from common.types import Observation

EVALUATORS = ("checks", "judge")
MAX_ANSWER_BYTES = 1024 * 1024
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_SYSTEM = (
    "You judge whether an agent operating an Android phone has completed a task. "
    "Look at the final screenshot and answer with one word: YES or NO."
)


@dataclass(frozen=True)
class Verdict:
    success: bool
    reason: str


class Evaluator(Protocol):
    needs_screenshot: bool
    """Whether `evaluate` wants the current screenshot as PNG (taking one costs a device round trip)."""

    def evaluate(
        self, device: AdbDevice, task: DeviceTask, observation: Observation, screenshot_png: bytes | None
    ) -> Verdict: ...


class ChecksEvaluator:
    """The task's success check over adb. Device faults pass through: they say nothing about the task."""

    needs_screenshot = False

    def __init__(self, timeout: float = 10.0):
        self.timeout = timeout

    def evaluate(
        self, device: AdbDevice, task: DeviceTask, observation: Observation, screenshot_png: bytes | None
    ) -> Verdict:
        holds, reason = evaluate_check(task.success, device, observation, self.timeout)
        return Verdict(holds, reason)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect would carry the bearer token to another host (and turn the POST into a GET)."""

    def redirect_request(self, *args, **kwargs):
        return None


class JudgeEvaluator:
    """Asks an OpenAI-compatible chat-completions endpoint whether the screenshot shows the task done.

    `cfg.timeout` bounds connecting and each read (urllib's socket timeout), not a slow trickle in all.
    """

    needs_screenshot = True

    def __init__(self, cfg: JudgeConfig):
        parts = urlsplit(cfg.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"judge URL must be http:// or https://host/..., got {cfg.url!r}")
        self.cfg = cfg
        self.failures: Counter[str] = Counter()
        """Failed judgements by cause: no_screenshot, http_error, timeout, unreachable, bad_response, unparsable, other."""
        self._opener = urllib.request.build_opener(_NoRedirect)

    def evaluate(
        self, device: AdbDevice, task: DeviceTask, observation: Observation, screenshot_png: bytes | None
    ) -> Verdict:
        if not screenshot_png or not screenshot_png.startswith(_PNG_MAGIC):
            return self._fail("no_screenshot", "no PNG screenshot to judge")
        try:
            answer = self._ask(task.instruction, screenshot_png)
        except urllib.error.HTTPError as e:
            return self._fail("http_error", f"HTTP {e.code} {e.reason}")
        except TimeoutError:
            return self._fail("timeout", f"no answer within {self.cfg.timeout:g} s")
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                return self._fail("timeout", f"no answer within {self.cfg.timeout:g} s")
            return self._fail("unreachable", str(e.reason)[:200])
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as e:
            return self._fail("bad_response", f"{type(e).__name__}: {str(e)[:200]}")
        except Exception as e:  # the contract: a judge failure is a "no", never a crash of the actor
            return self._fail("other", f"{type(e).__name__}: {str(e)[:200]}")
        verdict = parse_yes_no(answer)
        if verdict is None:
            return self._fail("unparsable", f"answer neither YES nor NO: {answer[:100]!r}")
        return Verdict(verdict, f"judge said {'YES' if verdict else 'NO'}")

    def _fail(self, cause: str, detail: str) -> Verdict:
        self.failures[cause] += 1
        return Verdict(False, f"judge failed ({cause}): {detail}")

    def _ask(self, instruction: str, png: bytes) -> str:
        image = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        body = {
            "model": self.cfg.model,
            "temperature": 0,
            "max_tokens": 16,
            "messages": [
                {"role": "system", "content": _SYSTEM},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": f"Task: {instruction}\nIs this task complete? Answer YES or NO.",
                        },
                        {"type": "image_url", "image_url": {"url": image}},
                    ],
                },
            ],
        }
        headers = {"Content-Type": "application/json"}
        token = os.environ.get(self.cfg.api_key_env) if self.cfg.api_key_env else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.cfg.url, json.dumps(body).encode(), headers, method="POST")
        with self._opener.open(request, timeout=self.cfg.timeout) as response:
            raw = response.read(MAX_ANSWER_BYTES + 1)
        if len(raw) > MAX_ANSWER_BYTES:
            raise ValueError(f"answer over {MAX_ANSWER_BYTES} bytes")
        content = json.loads(raw)["choices"][0]["message"]["content"]
        if isinstance(content, list):  # content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise TypeError(f"message content is {type(content).__name__}")
        return content


def parse_yes_no(answer: str) -> bool | None:
    """YES/NO from a model's answer: its first word if that is yes or no ("Yes.", "**NO**"), else the
    only one of the two it uses ("Answer: yes"); None when it uses neither or both."""
    words = re.findall(r"[a-z]+", answer.lower())
    if words and words[0] in ("yes", "no"):
        return words[0] == "yes"
    said = {w for w in words if w in ("yes", "no")}
    return said == {"yes"} if len(said) == 1 else None


def make_evaluator(kind: str, judge: JudgeConfig, timeout: float) -> Evaluator:
    """ "checks" (the task's checks, each run bounded by `timeout`) or "judge" (the VLM judge)."""
    if kind == "checks":
        return ChecksEvaluator(timeout)
    if kind == "judge":
        if not judge.url:
            raise ValueError("the judge evaluator needs the judge's URL: pass --adb.judge.url")
        return JudgeEvaluator(judge)
    raise ValueError(f"unknown evaluator {kind!r}; choose one of {EVALUATORS}")
