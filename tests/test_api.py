"""mbridge_perf.api: the tools from Python, on a live ConfigContainer (anything with
to_yaml()), a mapping, YAML text or a path, with the same reports the CLI and MCP give."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mbridge_perf import api
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.recipes import recipe_text
from mbridge_perf.memory.answer import estimate_with_answer

NAME = "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config"
TEXT = recipe_text(NAME)


class Container:
    """Stands in for Bridge's ConfigContainer: to_yaml() returns its dump."""

    def to_yaml(self, path: str | None = None) -> str | None:
        if path is not None:
            Path(path).write_text(TEXT)
            return None
        return TEXT


class PrintingContainer:
    """A to_yaml() that prints the YAML and returns nothing."""

    def to_yaml(self, path: str | None = None) -> None:
        print(TEXT)


class FileOnlyContainer:
    """A to_yaml(path) that only writes the file."""

    def to_yaml(self, path: str | None = None) -> None:
        if path is not None:
            Path(path).write_text(TEXT)


def _peak(report) -> float:
    return report.peak_allocated_gib


def test_estimate_accepts_every_form_and_gives_the_same_report(tmp_path: Path) -> None:
    dump = tmp_path / "config.yaml"
    dump.write_text(TEXT)
    expected = api.estimate(recipe=NAME)
    forms = [Container(), PrintingContainer(), FileOnlyContainer(),
             yaml.safe_load(TEXT), TEXT, dump, str(dump)]
    for form in forms:
        report = api.estimate(form)
        assert report.model_dump(exclude={"bridge"}) == expected.model_dump(
            exclude={"bridge"}), type(form).__name__
        if isinstance(form, Container | str | Path):  # the dump byte for byte: Bridge's
            assert report.bridge == expected.bridge  # recorded estimate for the recipe
    assert expected.parallelism["expert"] == 8 and expected.answer_markdown
    assert expected.bridge is not None and expected.bridge.source == "recorded"


def test_the_api_report_is_the_cli_and_mcp_report() -> None:
    from mbridge_perf.config.load import load_config

    assert api.estimate(Container(), gpu="B300").model_dump() == estimate_with_answer(
        load_config(text=TEXT), gpu="B300").model_dump()


def test_overrides_and_flags_apply_on_top_of_a_live_object() -> None:
    base = api.estimate(Container())
    smaller = api.estimate(Container(), overrides=["train.micro_batch_size=1"])
    assert _peak(smaller) < _peak(base)
    flagged = api.load(flags=["-m", "qwen3", "-mr", "qwen3_30b_a3b", "-g", "b300", "-c",
                              "fp8_mx", "-ng", "8", "-mb", "1"])
    assert flagged.train.micro_batch_size == 1 and flagged.model.num_moe_experts == 128


def test_without_bridge_the_report_says_so_in_one_line() -> None:
    report = api.estimate(Container(), overrides=["train.micro_batch_size=1"])
    assert report.bridge is not None and report.bridge.source in ("unavailable", "live")
    assert len(report.bridge.message.splitlines()) == 1


def test_validate_recommend_step_time_and_plan_take_the_same_inputs() -> None:
    v = api.validate(Container())
    assert v.findings is not None
    assert api.validate(TEXT, baseline=Container()).model_dump() is not None
    r = api.recommend(yaml.safe_load(TEXT), gpu="B300")
    assert r.baseline is not None
    st = api.step_time(Container(), gpu="B300")
    assert st.step_time_s > 0
    p = api.plan(preset="qwen3-30b-a3b", num_gpus=8, gpu="B300", seq_length=4096,
                 global_batch_size=64, top_k=2, constraints={"expert_tensor_parallel_size": [1]})
    assert p.layouts


def test_bad_input_is_one_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="cannot read a int"):
        api.estimate(42)
    with pytest.raises(ConfigError, match=r"^recipe: unknown recipe"):
        api.estimate(recipe="nope")
    with pytest.raises(ConfigError, match="not valid YAML"):
        api.estimate("model: [unclosed")
