"""What the input limits cost on real dumps, and how fast hostile input is refused.

Prints: ms per real Megatron Bridge dump for PyPI's safe_load vs our bounded reader (alias and
depth counting while composing, then the node / key / text walk), and the wall time to refuse
the issue's reproducers (a 296-byte alias bomb, a 50 MB YAML file, layout repeat bombs).

    .venv/bin/python benchmarks/input_limits.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bad_inputs import alias_bomb  # noqa: E402
from bridge_corpus import dump_texts  # noqa: E402
from mbridge_perf.config.errors import ConfigError  # noqa: E402
from mbridge_perf.config.limits import load_yaml  # noqa: E402
from mbridge_perf.config.load import load_config  # noqa: E402


def per_dump_ms(fn, texts: list[str]) -> float:
    start = time.perf_counter()
    for text in texts:
        fn(text)
    return (time.perf_counter() - start) / len(texts) * 1000


def refusal_s(**kwargs: object) -> tuple[float, str]:
    """Load (and validate) one input; the time to the first refusal and its text."""
    from mbridge_perf.rules import validate

    start = time.perf_counter()
    try:
        errors = [f.message for f in validate(load_config(**kwargs)).findings  # type: ignore[arg-type]
                  if f.severity == "error"]
        outcome = f"error finding: {errors[0]}" if errors else "accepted"
    except ConfigError as exc:
        outcome = str(exc)
    return time.perf_counter() - start, outcome[:90]


def main() -> None:
    texts = list(dump_texts().values())[:100]
    per_dump_ms(yaml.safe_load, texts[:5])  # warm up
    plain = per_dump_ms(yaml.safe_load, texts)
    bounded = per_dump_ms(lambda t: load_yaml(t, "dump"), texts)
    print(f"{len(texts)} real Bridge 0.6.2 dumps: yaml.safe_load {plain:.1f} ms/dump, "
          f"bounded reader {bounded:.1f} ms/dump ({(bounded / plain - 1) * 100:+.1f} %)")
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.yaml"
        big.write_text("dataset:\n  blob: " + "x" * (50 << 20) + "\n")
        cases = {
            "alias bomb (296 B, 9^8 values)": {"text": alias_bomb(8)},
            "50 MB YAML file": {"file": big},
            "layout E(t|)*99999999999L": {"preset": "llama3-8b", "overrides": [
                "model.pipeline_model_parallel_layout=E(t|)*99999999999L"]},
            "layout E(t|)*30000000L": {"preset": "llama3-8b", "overrides": [
                "model.pipeline_model_parallel_layout=E(t|)*30000000L"]},
        }
        for name, kwargs in cases.items():
            seconds, outcome = refusal_s(**kwargs)
            print(f"  {name:34} {seconds * 1000:8.1f} ms  {outcome}")


def regex_times() -> None:
    """The slowest adversarial 2 MB input per pattern of the package (tests/regex_adversary.py
    finds the shapes); tests/test_regex_linear.py keeps their growth linear."""
    from regex_adversary import package_patterns, worst_time

    rows = []
    for name, p, a in package_patterns():
        # a super-linear pattern would take minutes to hours at 2 MB: time it at 200 KB first
        # and, when that is already slow, report it from there (x10, the linear estimate;
        # tests/test_regex_linear.py judges the growth)
        small, shape = worst_time(p, a, 200_000)
        if small > 0.5:
            rows.append((name, small * 10, f"{shape} - {small:.2f} s at 200 KB already; 2 MB "
                                            "not run (x10 shown)"))
        else:
            rows.append((name, *worst_time(p, a, 2_000_000)))
    rows.sort(key=lambda r: -r[1])
    print(f"\nRegular expressions on adversarial 2 MB inputs ({len(rows)} patterns; CPU time; "
          "goal < 0.5 s each), slowest first:")
    for name, seconds, shape in rows[:15]:
        print(f"  {seconds:7.3f} s  {name}  {shape}")


if __name__ == "__main__":
    main()
    regex_times()
