"""metrics.jsonl on a full disk: a line the disk refuses is dropped whole and counted, the learner goes on,
and lines written once there is room again are read back intact."""

from __future__ import annotations

import json

from learner.observe.metrics import MetricsWriter


def test_a_refused_line_is_dropped_whole_and_counted(tmp_path, file_size_limit):
    warnings: list[str] = []
    writer = MetricsWriter(tmp_path, warnings.append)
    writer.write({"update": 1, "note": "fits"})
    size = writer.path.stat().st_size
    file_size_limit(size + 10)  # room for 10 bytes: the next line would be cut in the middle
    writer.write({"update": 2, "note": "a line longer than ten bytes"})
    writer.write({"update": 3, "note": "refused too"})
    assert writer.dropped == 2 and len(warnings) == 1 and "dropped" in warnings[0]
    assert writer.path.stat().st_size == size  # no half line left behind
    file_size_limit(None)
    writer.write({"update": 4})
    writer.close()
    lines = [json.loads(line) for line in writer.path.read_text().splitlines()]
    assert [line["update"] for line in lines] == [1, 4]
