"""servesim's own trace CSV: read and written (``save_trace`` writes what ``load`` reads).

Columns: ``arrival_time`` (s, kept as written), ``num_prompt_tokens``, ``output_len`` and
optional ``max_tokens``, ``priority``, ``request_id``, ``hash_ids`` (space-separated ints),
``prompt_segments`` (space-separated ``id:tokens`` pairs; see sim/kv/prefix_content.py).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from scenarios.traces.files import csv_rows, parse_int, parse_seconds
from scenarios.traces.formats import Progress
from scenarios.workload import Workload

REQUIRED = ("arrival_time", "num_prompt_tokens", "output_len")

#: Rows between two looks at whether the cut is met.
_BATCH = 4096


def _parse_segment(text: str, where: str) -> tuple[int, int]:
    sid, sep, length = text.partition(":")
    if not sep:
        raise ValueError(f"{where}: prompt_segments entry {text!r} is not id:tokens")
    return (parse_int(sid, "prompt_segments id", where, None),
            parse_int(length, "prompt_segments tokens", where))


def load(path: Path, num_requests: int | None = None,
         window_s: float | None = None) -> Workload:
    """The file's requests (all of them, or as far as the cut ``num_requests`` /
    ``window_s`` while the rows read are in time order: formats.Progress). Raises
    ValueError naming the line and the field."""
    index, rows = csv_rows(path, REQUIRED)
    progress = Progress("seconds", num_requests, window_s)
    arrival: list[float] = []
    prompt: list[int] = []
    out: list[int] = []
    cap: list[int] = []
    priority: list[int] = []
    ids: list[str] = []
    hashes: list[tuple[int, ...]] = []
    segments: list[tuple[tuple[int, int], ...]] = []

    def cell(row: list[str], name: str) -> str:
        return row[index[name]].strip() if name in index else ""

    for n, row in rows:
        where = f"{path.name} line {n}"
        arrival.append(parse_seconds(row[index["arrival_time"]], "arrival_time", where))
        prompt.append(parse_int(row[index["num_prompt_tokens"]], "num_prompt_tokens", where))
        out.append(parse_int(row[index["output_len"]], "output_len", where))
        text = cell(row, "max_tokens")
        cap.append(parse_int(text, "max_tokens", where) if text else out[-1])
        text = cell(row, "priority")
        priority.append(parse_int(text, "priority", where, None) if text else 0)
        ids.append(cell(row, "request_id") or str(n - 2))
        hashes.append(tuple(parse_int(h, "hash_ids", where, None, bounded=False)
                            for h in cell(row, "hash_ids").split()))
        segments.append(tuple(_parse_segment(x, where)
                              for x in cell(row, "prompt_segments").split()))
        if len(arrival) % _BATCH == 0 and progress.add(np.asarray(arrival[-_BATCH:])):
            break
    try:
        return Workload.from_arrays(
            arrival, prompt, out, max_tokens=cap, priority=priority, request_id=ids,
            hash_ids=hashes if "hash_ids" in index else None,
            source=f"servesim trace {path.name}",
            prompt_segments=segments if "prompt_segments" in index else None,
        )
    except ValueError as e:
        raise ValueError(f"{path.name}: {e}") from None


def save_trace(workload: Workload, path: Path | str) -> None:
    """Write ``workload`` as a servesim CSV that ``load_trace`` reads back equal.

    Columns: arrival_time (s, shortest exact float repr), num_prompt_tokens, output_len,
    max_tokens, priority, request_id, and hash_ids (space-separated) and prompt_segments
    (space-separated id:tokens) when present. The parent folder is created if needed;
    ``source`` is not stored.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [*REQUIRED, "max_tokens", "priority", "request_id"]
    if workload.hash_ids is not None:
        header.append("hash_ids")
    if workload.prompt_segments is not None:
        header.append("prompt_segments")
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for i in range(len(workload)):
            row: list[object] = [
                repr(float(workload.arrival_time[i])), int(workload.num_prompt_tokens[i]),
                int(workload.output_len[i]), int(workload.max_tokens[i]),
                int(workload.priority[i]), workload.request_id[i],
            ]
            if workload.hash_ids is not None:
                row.append(" ".join(str(h) for h in workload.hash_ids[i]))
            if workload.prompt_segments is not None:
                row.append(" ".join(f"{sid}:{n}" for sid, n in workload.prompt_segments[i]))
            writer.writerow(row)
