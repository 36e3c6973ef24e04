"""Deterministic eval grader: reads a case's ``checks`` and its skill's ``answer_checklist`` and
grades an answer (Markdown, or the JSON a tool returned) offline, with evidence per expectation."""
