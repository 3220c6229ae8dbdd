"""ThinkingBox task files: the test-case parser (ast only, never run), the dataset layout, the
init merge, and the errors a user sees. No server processes here (see test_mcp.py)."""
import textwrap
from pathlib import Path

import pytest
import yaml

from tbhpc.errors import PackError, UserError
from tbhpc.tb.dataset import TBDataset, merge_init
from tbhpc.tb.checks import UngradableFile
from tbhpc.tb.testfile import parse_test_file

SCENARIO = """\
world_state:
  shop:
    sources: [{name: refunds.md, snippets: ["Refunds within 30 days."]}]
    rubrics_yesno: null
tools:
  - name: get_order
  - name: cancel_order
    override_description: Cancel an order (only pending ones).
    override_arg_description: {order_id: The order to cancel.}
  - name: transfer_to_human
    is_end_turn: true
bot_instructions: You are the shop's support agent.
"""

CLEAN = '''\
"""!
scenario: shop_support
tags: [shop]
"""
import os


def test_cancel(x, judge):
    """!
    query: Please cancel order O1.
    user_context: |
      You are Ann. Your order is O1.
    max_user_sim_turns: 4
    tags: [cancel]
    init:
      shop:
        data_patch: {orders: [{id: O1, status: pending}]}
        golden_test_case:
          tool_interactions:
            - {tool: get_order, parameters: {order_id: O1}}
            - {tool: cancel_order, parameters: {order_id: O1}}
    """
    validate_database(x)


def test_refund_words(x, judge):
    """!
    query: Can I get a refund?
    init:
      shop:
        rubrics_yesno: ["Does the message mention the 30-day window?"]
    """
    validate_database(x)
    validate_rubrics_yesno(x, judge)


def not_a_test(x):
    return 1
'''

# the same tests in a file that would run code when loaded, and whose helper raises
HOSTILE = CLEAN.replace("import os\n", '''import os
open(os.environ["TBHPC_MARKER"], "w").write("executed")   # would run on import or exec
raise RuntimeError("this file was executed")


def validate_database(x):
    raise RuntimeError("a helper ran")
''')


def _dataset(tmp_path: Path, test_file: str = CLEAN, name: str = "shop_support_group1.py", folder: str = "shop_support") -> Path:
    (tmp_path / "dataset" / "scenario").mkdir(parents=True)
    (tmp_path / "dataset" / "scenario" / "shop_support.yaml").write_text(SCENARIO)
    d = tmp_path / "dataset" / "test_case" / folder
    d.mkdir(parents=True)
    (d / name).write_text(test_file)
    return tmp_path


def test_a_file_is_read_from_its_docstrings(tmp_path):
    root = _dataset(tmp_path)
    tests = parse_test_file(root / "dataset/test_case/shop_support/shop_support_group1.py")
    assert [t.name for t in tests] == ["test_cancel", "test_refund_words"]
    assert tests[0].config["scenario"] == "shop_support" and tests[0].config["tags"] == ["shop", "cancel"]
    assert tests[0].checks == ("validate_database",)
    assert tests[1].checks == ("validate_database", "validate_rubrics_yesno")
    assert tests[0].servers == {"validate_database": None}     # no helper of its own: tbhpc's check, every server
    tasks = TBDataset(root).tasks(["shop_support_group1.py:test_refund_words", "shop_support_group1.py:test_cancel"])
    refund, cancel = tasks
    assert cancel.id == "shop_support_group1.py:test_cancel" and cancel.domain == "shop_support"
    assert cancel.max_user_turns == 4 and cancel.tags == ("shop", "cancel")
    assert [c.tool for c in cancel.golden_calls] == ["get_order", "cancel_order"]
    assert cancel.backend["kind"] == "tb-mcp" and cancel.backend["scenario"] == "shop_support"
    assert cancel.backend["init"]["shop"]["data_patch"] == {"orders": [{"id": "O1", "status": "pending"}]}
    assert cancel.backend["max_agent_turns"] is None
    assert [r.question for r in refund.rubrics_yesno] == ["Does the message mention the 30-day window?"]
    assert refund.max_user_turns == 10 and "graded_servers" not in refund.backend


def test_a_file_that_would_run_code_is_never_run_and_is_skipped_with_its_reason(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("TBHPC_MARKER", str(marker))
    root = _dataset(tmp_path, HOSTILE)
    (root / "dataset/test_case/shop_support/shop_support_other.py").write_text(CLEAN)
    path = root / "dataset/test_case/shop_support/shop_support_group1.py"
    why = ("line 6: the file runs code of its own when loaded (`open(os.environ['TBHPC_MARKER'], 'w').write('executed')`); "
           "the reference would run it before every test, and tbhpc never runs test files")
    with pytest.raises(UngradableFile) as err:
        parse_test_file(path)
    assert str(err.value) == f"{path}: {why}"
    ds = TBDataset(root)
    assert [t.id for t in ds.tasks()] == ["shop_support_other.py:test_cancel", "shop_support_other.py:test_refund_words"]
    assert ds.skipped == {"shop_support/shop_support_group1.py": why}
    with pytest.raises(UngradableFile):
        TBDataset(root, strict=True).tasks()
    with pytest.raises(UserError) as err:
        ds.tasks(["shop_support_other.py:test_cancel", "shop_support_group1.py:test_cancel"])
    assert str(err.value) == (f"task shop_support_group1.py:test_cancel is in a file tbhpc cannot grade (it never runs "
                              f"test files): {path}: {why}")
    assert not marker.exists()                 # nothing in the file ever ran


def test_bare_file_names_resolve_under_their_prefix_folder(tmp_path):
    root = _dataset(tmp_path, name="shop_support_v2_group7.py", folder="shop_support_v2")
    ds = TBDataset(root / "dataset")           # the dataset/ folder itself works too
    assert ds.testfile_path("shop_support_v2_group7.py").parent.name == "shop_support_v2"
    with pytest.raises(UserError, match="no test-case file 'shop_other.py'"):
        ds.testfile_path("shop_other.py")
    with pytest.raises(UserError, match="test_missing"):
        ds.tasks(["shop_support_v2_group7.py:test_cancel", "shop_support_v2_group7.py:test_missing"])
    with pytest.raises(UserError, match="expected '<file name>:<test name>'"):
        ds.tasks(["just_a_name"])


def test_init_merge_follows_the_reference_rules():
    a = {"shop": {"sources": [1], "data_patch": None, "deep": {"x": 1, "keep": True}}}
    b = {"shop": {"sources": [2], "data_patch": {"t": []}, "deep": {"x": 2}}, "other": {"y": 1}}
    assert merge_init(a, b) == {"shop": {"sources": [1, 2], "data_patch": {"t": []}, "deep": {"x": 2, "keep": True}},
                                "other": {"y": 1}}
    assert a["shop"]["sources"] == [1]         # inputs untouched


@pytest.mark.parametrize("body, message", [
    ("    assert x.response == 'ok'\n", r"line 7: the test body has a statement of type Assert"),
    ("    validate_database(x)\n    judge.custom_rubric_score(x)\n", r"line 8: the test body calls custom_rubric_score\(\)"),
    ("    pass\n", r"never calls validate_database"),
])
def test_a_body_tbhpc_cannot_grade_natively_is_refused_with_its_line(tmp_path, body, message):
    text = '"""!\nscenario: shop_support\n"""\n\ndef test_x(x, judge):\n    """!\n    query: hi\n    """\n' + body
    text = text.replace('    """!\n    query: hi\n    """\n', '    """!query: hi"""\n')
    path = tmp_path / "t.py"
    path.write_text(text)
    with pytest.raises(PackError, match=message) as err:
        parse_test_file(path)
    assert str(path) in str(err.value) and "test_x" in str(err.value)


def test_yaml_and_key_errors_name_file_test_and_line(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(textwrap.dedent('''\
        def test_a(x, judge):
            """!
            query: [unclosed
            """
            validate_database(x)
        '''))
    with pytest.raises(PackError, match=r"t.py: task test_a: line \d+: malformed YAML docstring"):
        parse_test_file(path)
    path.write_text('def test_b(x, judge):\n    """!\n    querry: hi\n    """\n    validate_database(x)\n')
    with pytest.raises(PackError, match=r"task test_b: field querry: line 2: unknown key 'querry'"):
        parse_test_file(path)
    path.write_text("def test_c(:\n")
    with pytest.raises(PackError, match=r"line 1: not valid Python"):
        parse_test_file(path)


def test_scenario_errors_are_one_line_naming_the_field(tmp_path):
    root = _dataset(tmp_path)
    (root / "dataset/scenario/shop_support.yaml").write_text(SCENARIO.replace("is_end_turn: true", "is_end_trun: true"))
    with pytest.raises(PackError, match=r"shop_support.yaml: field tools\[2\].is_end_trun: unknown field"):
        TBDataset(root).tasks(["shop_support_group1.py:test_cancel"])
    with pytest.raises(UserError, match="not a ThinkingBox data directory"):
        TBDataset(tmp_path / "dataset" / "scenario")


def test_server_schemas_are_shown_plain_refs_inlined_titles_stripped():
    from tbhpc.mcp.env import plain_schema
    pydantic_like = {
        "title": "CancelRequest", "type": "object",
        "$defs": {"Reason": {"title": "Reason", "type": "string", "enum": ["changed_mind", "damaged"]},
                  "Item": {"title": "Item", "type": "object", "properties": {"sku": {"title": "Sku", "type": "string"}}}},
        "properties": {
            "title": {"title": "Title", "type": "string"},                 # a property named title stays
            "reason": {"$ref": "#/$defs/Reason", "description": "why"},
            "items": {"title": "Items", "type": "array", "items": {"$ref": "#/$defs/Item"}},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Note"},
        },
        "required": ["reason"],
    }
    assert plain_schema(pydantic_like) == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "reason": {"type": "string", "enum": ["changed_mind", "damaged"], "description": "why"},
            "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["reason"],
    }
    looped = {"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}, "$ref": "#/$defs/Node"}
    assert plain_schema(looped) == {"type": "object", "properties": {"next": {}}}   # a recursive ref stops, never loops


# ---- release-style files: the file's own helpers, recognised or refused ------------------------

def _group1(tmp_path: Path, text: str) -> Path:
    from tb_release_fixture import SCENARIO
    (tmp_path / "dataset" / "scenario").mkdir(parents=True, exist_ok=True)
    (tmp_path / "dataset" / "scenario" / "shop_support.yaml").write_text(yaml.safe_dump(SCENARIO))
    folder = tmp_path / "dataset" / "test_case" / "shop_support"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shop_support_group1.py").write_text(text)
    return folder / "shop_support_group1.py"


def test_the_reference_helpers_are_recognised_and_name_the_servers_graded(tmp_path):
    from tb_release_fixture import rubric_file
    path = _group1(tmp_path, rubric_file())
    (fn,) = parse_test_file(path)
    assert fn.checks == ("validate_database", "validate_rubrics_yesno")
    assert fn.servers == {"validate_database": ("shop",), "validate_rubrics_yesno": ("shop",)}
    (task,) = TBDataset(tmp_path).tasks(["shop_support_group1.py:test_cancel_rubric_001"])
    assert task.backend["graded_servers"] == ["shop"]
    assert [r.question for r in task.rubrics_yesno] == ["Does the message confirm that the order is cancelled?"]


@pytest.mark.parametrize("edit, line, message", [
    # a helper that returns without checking: the reference would pass every attempt by it
    (lambda t: t.replace('    mine = x.effects[SERVER_NAME]["result_db_hash"]\n',
                         '    return\n    mine = x.effects[SERVER_NAME]["result_db_hash"]\n'), 11,
     "the file's own validate_database() is not the reference's hash check, and tbhpc never runs test files, "
     "so it cannot grade by it"),
    # compares the golden hash with itself
    (lambda t: t.replace('["result_db_hash"]', '["golden_db_hash"]'), 13,
     "the file's own validate_database() is not the reference's hash check, and tbhpc never runs test files, "
     "so it cannot grade by it"),
    # the check name bound by an import instead
    (lambda t: t.replace("import json\n", "import json\nfrom shop_checks import validate_database\n"), 2,
     "binds validate_database by ImportFrom: not the reference's helper; tbhpc never runs test files"),
])
def test_a_helper_that_shadows_a_check_is_refused_with_its_line(tmp_path, edit, line, message):
    from tb_release_fixture import group1
    path = _group1(tmp_path, edit(group1()))
    with pytest.raises(UngradableFile) as err:
        parse_test_file(path)
    assert str(err.value) == f"{path}: line {line}: {message}"


def test_a_check_called_with_anything_but_the_tests_parameters_is_refused(tmp_path):
    from tb_release_fixture import group1, test_function
    body = 'validate_database(__import__("os").system("touch /tmp/tbhpc-pwned"))'
    path = _group1(tmp_path, group1(extra=test_function("test_sneaky_003", "O5", [], body)))
    with pytest.raises(UngradableFile) as err:
        parse_test_file(path)
    line = path.read_text().splitlines().index("    " + body) + 1
    assert str(err.value) == (f"{path}: task test_sneaky_003: line {line}: validate_database(__import__('os').system("
                              f"'touch /tmp/tbhpc-pwned')): a check takes only the test's own parameters "
                              f"(validate_database(x))")
    path.write_text(group1(extra=test_function("test_swapped_003", "O5", [], "validate_database(judge)")))
    with pytest.raises(UngradableFile, match=r"task test_swapped_003: line \d+: validate_database\(judge\): a check takes"):
        parse_test_file(path)


def test_a_helper_reading_a_server_the_scenario_does_not_run_is_refused(tmp_path):
    from tb_release_fixture import group1
    path = _group1(tmp_path, group1().replace('SERVER_NAME = "shop"', 'SERVER_NAME = "warehouse"'))
    with pytest.raises(PackError) as err:
        TBDataset(tmp_path).tasks(["shop_support_group1.py:test_cancel_001"])
    assert str(err.value) == (f"{path}: task test_cancel_001: the file's validate_database() reads server 'warehouse', "
                              "which scenario shop_support does not run (it runs: shop)")


@pytest.mark.parametrize("code, line, what", [
    ("import os\nos.system('true')\n", 2, "`os.system('true')`"),
    ("import os\nHOME = os.environ['HOME']\n", 2, "`HOME = os.environ['HOME']`"),
    ("import functools\n\n@functools.cache\ndef helper(x):\n    return x\n", 4, "a decorator"),
    ("def helper(x=print('loaded')):\n    return x\n", 1, "default argument values"),
    ("def helper(x: print('loaded')):\n    return x\n", 1, "an annotation that is an expression"),
    ("class Box:\n    pass\n", 1, "`class Box:`"),
])
def test_module_code_that_would_run_when_loaded_makes_the_file_ungradable(tmp_path, code, line, what):
    path = tmp_path / "t.py"
    path.write_text(code + '\n\ndef test_x(x: TestContext, judge: "Judge") -> None:\n    """!query: hi"""\n'
                    '    validate_database(x)\n')
    with pytest.raises(UngradableFile) as err:
        parse_test_file(path)
    assert str(err.value) == (f"{path}: line {line}: the file runs code of its own when loaded ({what}); the reference "
                              "would run it before every test, and tbhpc never runs test files")
    path.write_text('\ndef test_x(x: TestContext, judge: "Judge") -> list[str] | None:\n    """!query: hi"""\n'
                    '    validate_database(x)\n')
    assert [t.name for t in parse_test_file(path)] == ["test_x"]    # plain annotations run nothing
