"""The grader's vocabulary on its own: every spelling of a parallel size or a size change reads
as one token, numbers with units normalise, checklist phrases have their synonyms, and the key
allowlist knows Bridge's sections."""

from __future__ import annotations

import pytest

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.keys import is_known_key
from mbridge_perf.evals.matching import find_any, recommended
from mbridge_perf.evals.text import normalise
from mbridge_perf.evals.vocab import synonyms


@pytest.mark.parametrize("text", [
    "TP=8", "TP8", "tp 8", "tensor-parallel degree 8", "tensor parallel size 8",
    "tensor_model_parallel_size=8", "8-way TP", "TP 8-way", "`tensor_model_parallel_size: 8`",
])
def test_every_spelling_of_a_size_is_one_token(text: str) -> None:
    assert "tp=8" in normalise(text)


@pytest.mark.parametrize("text", [
    "TP 4→8", "TP 4->8", "TP=4 → TP=8", "TP from 4 to 8", "TP 4-way → 8-way",
    "4-way → 8-way TP", "tensor parallelism 4 -> 8",
])
def test_every_spelling_of_a_size_change_reads_the_same(text: str) -> None:
    assert "tp=4 -> tp=8" in normalise(text)


@pytest.mark.parametrize("text", ["28 %", "28%", "28 percent", "28 per cent"])
def test_percentages_with_a_space_or_a_word(text: str) -> None:
    assert normalise(text) == "28%"


def test_a_unicode_minus_and_long_runs_of_space() -> None:
    assert normalise("−28 percent") == "-28%"
    assert normalise("TP" + " " * 5000 + "=8") == "tp=8"


def test_vpp_and_pp_stay_apart() -> None:
    assert "pp=8" not in normalise("VPP 8-way").replace("vpp=8", "")
    assert "vpp=5 -> vpp=10" in normalise("VPP 5→10")


@pytest.mark.parametrize(("term", "text"), [
    ("one variable at a time", "Keep to one knob per A/B."),
    ("one variable at a time", "Retune, one knob at a time."),
    ("measurement contract", "1. **Contract.** Pin versions, topology and window."),
    ("41-50", "Report the window 41–50."),
    ("28%", "TP 4→8 cost 28 % throughput."),
    ("maximize DP", "Scale: max DP, EP over extra TP."),
    ("ETP x EP x EDP x PP", "MoE ETP1 × EP8 × EDP2 × PP1."),
])
def test_checklist_phrases_match_their_synonyms(term: str, text: str) -> None:
    assert find_any(parse_answer(text).units, term), (term, text)


def test_synonyms_are_looked_up_by_spelling_not_case() -> None:
    assert synonyms("One Variable At A Time") == synonyms("one_variable_at_a_time")
    assert synonyms("no such phrase") == []


def test_bridge_sections_and_fields_are_known_keys() -> None:
    assert is_known_key("mixed_precision")
    assert is_known_key("tensor_model_parallel_size")
    assert not is_known_key("recompute_attention_layers")


def test_a_graph_scope_list_is_not_recompute_advice() -> None:
    units = parse_answer("Set cuda_graph_modules: [mlp] with cuda_graph_impl=transformer_engine."
                         ).units
    assert not recommended(units, "mlp")
    assert recommended(parse_answer("Add recompute_modules: [mlp].").units, "mlp")


@pytest.mark.parametrize(("term", "text"), [
    ("maximize DP", "3. **スケール**：データ並列度を最大化し、ノード間は PP に回す。"),
    ("maximize DP", "次に dp は最大に保ちます。"),
    ("one variable at a time", "A/B は一度に 1 つの変更だけ行う。"),
    ("one variable at a time", "チューニングでは 1 度に 1 つのノブを動かす。"),
    ("dominant wall", "Nsight で bottleneck を特定してから次へ進む。"),
    ("dominant wall", "最初に支配的なボトルネックを測る。"),
    ("selective recompute", "メモリが足りなければ選択的な再計算を使う。"),
    ("selective recompute", "再計算は selective から始め、full は最後。"),
])
def test_japanese_checklist_phrases_are_recommended(term: str, text: str) -> None:
    """The seeds are Japanese; a plan in Japanese with English terms recommends the same steps
    (blind batch 1: a Japanese plan failed four checklist items it covered)."""
    assert recommended(parse_answer(text).units, term), (term, text)
