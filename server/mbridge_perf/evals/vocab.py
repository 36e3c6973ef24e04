"""The grader's vocabulary in one place: how a knob, a label or a step of a skill's checklist may
be spelled in an answer.

- Parallel sizes: every spelling ("tensor-parallel degree 8", "TP=8", "TP8", "8-way TP",
  ``tensor_model_parallel_size=8``) normalises to one token (``tp=8``), see ``SIZES``.
- Config keys: Megatron Bridge's known fields (``config/known_fields.json``) and sections, the
  perf-harness flags and the label sets: ``evals.keys.is_known_key``.
- Phrases: the words a checklist item or a misconception is matched on, with the other ways
  people say the same thing (``synonyms``). A synonym starting with ``re:`` is a regular
  expression over normalised text (lower case, one space, sizes as ``tp=8``); every other one is
  a literal term (``_``, ``-`` and spaces interchangeable).
"""

from __future__ import annotations

# Parallel sizes: (regex of every spelling, the one token). Order matters: longer names first.
SIZES: list[tuple[str, str]] = [
    (r"virtual[_ ]pipeline[_ ]model[_ ]parallel[_ ]size|virtual[ -]pipeline(?:[ -]parallel"
     r"(?:ism)?)?(?: (?:size|degree))?|\bvpp", "vpp"),
    (r"tensor[_ ]model[_ ]parallel[_ ]size|tensor[ -]parallel(?:ism)?(?: (?:size|degree))?"
     r"|\btp", "tp"),
    (r"pipeline[_ ]model[_ ]parallel[_ ]size|pipeline[ -]parallel(?:ism)?(?: (?:size|degree))?"
     r"|\bpp", "pp"),
    (r"context[_ ]parallel[_ ]size|context[ -]parallel(?:ism)?(?: (?:size|degree))?|\bcp", "cp"),
    (r"expert[_ ]tensor[_ ]parallel[_ ]size|\betp", "etp"),
    (r"expert[_ ]model[_ ]parallel[_ ]size|expert[ -]parallel(?:ism)?(?: (?:size|degree))?"
     r"|\bep", "ep"),
    (r"expert[ -]data[ -]parallel(?:ism)?(?: (?:size|degree))?|\bedp", "edp"),
    (r"data[ -]parallel(?:ism)?(?: (?:size|degree))?|\bdp", "dp"),
]
SIZE_TOKENS = "vpp|etp|edp|tp|pp|cp|ep|dp"

_MESH = r"re:etp(?:=\d+)? ?[x×*·] ?ep(?:=\d+)? ?[x×*·] ?edp"

# Japanese (the seeds' language; answers mix it with English terms, without spaces between
# words): "DP を最大化" maximize DP, "1 回に 1 変数" / "一度に1つの変数" one variable at a time,
# "支配的な壁" / "wall を特定" name the dominant wall, "selective から" / "選択的再計算" selective
# recompute (first).
_JA_ONE = r"(?:1|１|一) ?(?:つ|個)?(?:の)?"
_JA_ONE_VARIABLE = [
    rf"re:(?:1|１|一) ?(?:回|度)に ?{_JA_ONE} ?(?:変数|変更|ノブ|パラメータ)",
    rf"re:一度に ?{_JA_ONE} ?(?:変数|変更|ノブ|パラメータ)",
    rf"re:(?:変数|変更|ノブ|knob|variable)を ?(?:一度に|(?:1|一) ?(?:回|度)に) ?{_JA_ONE}",
]
_JA_WALL = [
    r"re:支配的な ?(?:壁|ボトルネック|wall|bottleneck)",
    r"re:(?:wall|bottleneck|壁|ボトルネック) ?を ?(?:特定|見極め|名指し|明らか|確認)",
]
_JA_MAX_DP = r"re:(?<![a-z])(?:dp|データ並列(?:度|数)?)(?:=\d+)? ?(?:を|は) ?最大(?:化|に)"
_JA_SELECTIVE = [
    r"re:選択的(?:な)? ?(?:アクティベーション)?(?:再計算|recompute)",
    r"re:(?:recompute|再計算)(?:は|を) ?selective",
    r"re:(?<![a-z_])selective ?から",
]

# Checklist and claim phrases -> other spellings of the same advice (keys are lower case).
SYNONYMS: dict[str, list[str]] = {
    # measurement discipline
    "measurement contract": ["re:^(?:\\d+[.)] ?)?contract ?[.:]", "freeze the contract",
                             "re:pin (?:the )?versions"],
    "one variable at a time": ["one knob at a time", "one knob per a/b", "one change per run",
                               "one thing at a time", "re:retune,? one (?:knob|thing|change)",
                               "re:retune one (?:knob|thing|change)", "change nothing else",
                               "re:each (?:gets )?its own (?:matched )?run",
                               "one variable per run", "one knob per run", "single change",
                               *_JA_ONE_VARIABLE],
    "one change at a time": ["one knob at a time", "one knob per a/b"],
    "single variable": ["single knob", "single change"],
    "dominant wall": ["re:^(?:\\d+[.)] ?)?profile ?[.:,]",
                      "re:(?:host|launch|memory|communication|compute)(?:/launch)? wall",
                      "dominant bottleneck", "name the wall", "which wall", *_JA_WALL],
    "dominant bottleneck": ["re:the bottleneck is", "dominant wall", *_JA_WALL],
    "maximize dp": ["re:^(?:\\d+[.)] ?)?scale ?[.:,]", "max dp", "re:dp is maximi[sz]ed",
                    "maximise data parallel",
                    "maximize data parallel", "keep dp as large as", _JA_MAX_DP],
    "ep over extra tp": ["ep over more tp", "re:ep rather than (?:more|extra) tp"],
    "parallel folding": [_MESH],
    "etp x ep x edp x pp": [_MESH],
    "selective recompute": ["selective before full", "re:selective (?:rather than|over|not) full",
                            *_JA_SELECTIVE],
    "at least 50 steps": ["re:(?:≥|>=) ?50 (?:steps|iterations)", "at least 50 iterations"],
    "50 steps": ["50 iterations"],
    "41-50": ["re:41 ?(?:-|to|through|–) ?50"],
    "alltoall": ["all-to-all", "all to all"],
    # memory
    "expandable segments": ["expandable_segments"],
    "trade dp for pp": ["re:halv\\w* dp", "re:dp=2 -> dp=1"],
    "gradient accumulation": ["grad accumulation", "gradient-accumulation"],
    "raise tp": ["re:tp=\\d+ -> tp=\\d+", "increase tp", "higher tp", "more tp"],
    "28%": ["28.4%"],
    # long context
    "preserve dp": ["keep dp", "protect dp", "re:dp (?:budget|floor)"],
    "gpu budget": ["gpu count", "re:\\d+ gpus? (?:budget|available)"],
    "static shape": ["static shapes", "fixed shapes", "fixed seq_length"],
    "newer kernels": ["current container", "recent container", "latest container"],
}


def synonyms(term: str) -> list[str]:
    """The other spellings of a checklist or claim term (empty when it has none)."""
    return SYNONYMS.get(" ".join(term.lower().replace("_", " ").split()), [])
