"""Every flag's choices are its owner's constant, declared once (issue 45): the flags table names them, never
spells them out, and the owners check against the same tuples."""

from __future__ import annotations

import ast

import pytest

from testing.paths import REPO_ROOT
from zserve.common.server_flags import FLAG_SPECS

META_CHOICES = ("auto", "none")  # "choose for me" / "off": a flag's own values, not a name an owner answers to


def choices_nodes() -> list[tuple[str, ast.expr]]:
    tree = ast.parse((REPO_ROOT / "common" / "server_flags.py").read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "choices" and not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None):
                    found.append((ast.unparse(keyword.value), keyword.value))
    return found


def literal_names(node: ast.expr) -> list[str]:
    """The strings written out in a choices expression, besides the meta choices."""
    if isinstance(node, ast.Name):
        return []
    if isinstance(node, (ast.Tuple, ast.List)):
        names = []
        for element in node.elts:
            if isinstance(element, ast.Starred) and isinstance(element.value, ast.Name):
                continue
            if isinstance(element, ast.Constant) and element.value in META_CHOICES:
                continue
            names.append(ast.unparse(element))
        return names
    return [ast.unparse(node)]


def test_no_flag_spells_out_its_choices():
    nodes = choices_nodes()
    assert len(nodes) >= 15, "the flags table's choices were not found"
    spelled = {text: literal_names(node) for text, node in nodes if literal_names(node)}
    assert not spelled, f"choices written out in server_flags.py instead of their owner's constant: {spelled}"


def test_the_rule_catches_a_literal_tuple():
    assert literal_names(ast.parse("('fifo', 'pack')", mode="eval").body) == ["'fifo'", "'pack'"]
    assert literal_names(ast.parse("('auto', *GEMM)", mode="eval").body) == []


def test_the_owners_check_against_the_same_tuples():
    from zserve.common.kernel_choices import ATTENTION_BACKENDS
    from zserve.common.scheduler_choices import ADMISSION_POLICIES, KV_RESERVATIONS, STEP_POLICIES
    from zserve.common.speculative_settings import SPECULATIVE_ALGORITHMS
    from zserve.common.think_markers import REASONING_PARSERS
    from zserve.common.tool_call_format import TOOL_CALL_FORMATS
    from zserve.http_proc import reasoning
    from zserve.http_proc.tools import parser
    from zserve.scheduler_proc import admission_policy, kv_reservation, speculation, step_policy

    assert step_policy.STEP_POLICIES is STEP_POLICIES is FLAG_SPECS["schedule_policy"].choices
    assert admission_policy.ADMISSION_POLICIES is ADMISSION_POLICIES is FLAG_SPECS["admission_policy"].choices
    assert kv_reservation.KV_RESERVATIONS is KV_RESERVATIONS is FLAG_SPECS["kv_reservation"].choices
    assert speculation.SPECULATIVE_ALGORITHMS is SPECULATIVE_ALGORITHMS is FLAG_SPECS["speculative_algorithm"].choices
    assert reasoning.REASONING_PARSERS is REASONING_PARSERS
    assert FLAG_SPECS["reasoning_parser"].choices == ("none", *REASONING_PARSERS)
    assert tuple(parser.SCANNERS) == TOOL_CALL_FORMATS
    assert FLAG_SPECS["tool_call_parser"].choices == ("auto", *TOOL_CALL_FORMATS)
    assert FLAG_SPECS["attention_backend"].choices is ATTENTION_BACKENDS


def test_the_owners_refuse_what_the_flags_table_does_not_offer():
    from zserve.scheduler_proc.admission_policy import AdmissionPolicy
    from zserve.scheduler_proc.step_policy import StepPolicy

    for name in FLAG_SPECS["schedule_policy"].choices:
        assert StepPolicy(name, 16).name == name
    for name in FLAG_SPECS["admission_policy"].choices:
        AdmissionPolicy(name, lookahead=4, force_fifo_every=2)
    with pytest.raises(ValueError, match="lifo"):
        StepPolicy("lifo", 16)
