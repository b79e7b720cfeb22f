"""Summarise py-spy raw profiles (``served.py --profile``) as data: per process, the share of
samples with each function (and the line it was on) somewhere on the stack.

    python benchmarks/pyspy_summary.py --top 40 --out benchmarks/results/NAME-pyspy.json \\
        LABEL=served-h200-pic-256-block-pyspy.txt [LABEL=FILE ...]

A raw file holds one ``frame;frame;... count`` line per distinct stack; its first frame names the
process tree's root, its second the process (``process N:"VLLM::EngineCore"``) or a frame of the root.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

_PROCESS = re.compile(r'process \d+:"([^"]*)"')
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)$")


def raw_stacks(raw: str) -> Iterator[tuple[list[str], int]]:
    """Each stack of a raw profile as its frames and sample count, less the stacks torn by
    sampling without pausing the process (`served.profiled`: a line cut inside a frame, no count)."""
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            yield stack.split(";"), int(count)


def summarise(raw: str, top: int) -> dict[str, dict]:
    """``{process: {"samples": n, "functions": [[frame, share], ...]}}``, shares of that process's samples."""
    samples: Counter[str] = Counter()
    frames: dict[str, Counter[str]] = {}
    for parts, count in raw_stacks(raw):
        process = _PROCESS.match(parts[1]) if len(parts) > 1 else None
        name = process.group(1) if process else "api server (root process)"
        samples[name] += count
        seen = set(map(_short, parts[2 if process else 1 :]))
        frames.setdefault(name, Counter()).update(dict.fromkeys(seen, count))
    return {
        name: {
            "samples": total,
            "functions": [[frame, round(n / total, 3)] for frame, n in frames[name].most_common(top)],
        }
        for name, total in samples.most_common()
    }


def _short(frame: str) -> str:
    """``name (path/to/file.py:line)`` as ``name (file.py:line)``."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    line = f":{match['line']}" if match["line"] else ""
    return f"{match['name']} ({Path(match['file']).name}{line})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", nargs="+", metavar="LABEL=FILE")
    parser.add_argument("--top", type=int, default=40, help="functions kept per process")
    parser.add_argument("--what", default="", help="what was profiled (the command, the run), recorded as is")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result: dict = {"what": args.what}
    for item in args.profiles:
        label, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"{item!r}: expected LABEL=FILE")
        result[label] = summarise(Path(path).read_text(errors="replace"), args.top)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
