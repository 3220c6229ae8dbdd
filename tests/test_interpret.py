"""The one interpreter: reasoning split, Qwen3 XML and Hermes tool calls, schema coercion."""
from tbhpc.interpret import coerce_arguments, interpret, render_tool_call

SCHEMAS = {
    "create_return": {"type": "object", "properties": {
        "order_id": {"type": "string"}, "quantity": {"type": "integer"}, "reason": {"type": "string", "enum": ["defective"]},
        "expedite": {"type": "boolean"}, "amount": {"type": "number"}, "tags": {"anyOf": [{"type": "array"}, {"type": "null"}]},
        "meta": {"type": "object"}, "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}},
}

QWEN_XML = """<think>
The customer wants a return. Order O2001 has 2 units.
</think>
Let me open that return for you.
<tool_call>
<function=create_return>
<parameter=order_id>
O2001
</parameter>
<parameter=quantity>
2
</parameter>
<parameter=expedite>
true
</parameter>
<parameter=amount>
79.99
</parameter>
<parameter=tags>
["gift", "urgent"]
</parameter>
<parameter=note>
123
</parameter>
</function>
</tool_call><|im_end|>"""


def test_qwen3_xml_with_reasoning_and_coercion():
    r = interpret(QWEN_XML, SCHEMAS)
    assert r.reasoning.startswith("The customer wants a return")
    assert r.text == "Let me open that return for you."
    assert len(r.tool_calls) == 1
    c = r.tool_calls[0]
    assert c.error is None and c.name == "create_return"
    assert c.arguments == {"order_id": "O2001", "quantity": 2, "expedite": True, "amount": 79.99,
                           "tags": ["gift", "urgent"], "note": "123"}  # string-typed stays a string


def test_hermes_json_calls_multiple_and_string_arguments():
    raw = ('<tool_call>\n{"name": "create_return", "arguments": {"order_id": "O1", "quantity": "3", "expedite": "false"}}\n</tool_call>\n'
           '<tool_call>{"name": "create_return", "arguments": "{\\"order_id\\": \\"O2\\", \\"limit\\": \\"null\\"}"}</tool_call>')
    r = interpret(raw, SCHEMAS)
    assert [c.arguments for c in r.tool_calls] == [
        {"order_id": "O1", "quantity": 3, "expedite": False}, {"order_id": "O2", "limit": None}]
    assert r.text == "" and r.reasoning == ""


def test_reasoning_opened_by_template_and_unclosed_think():
    r = interpret("checking the order first</think>Sure, done. <DONE>")
    assert r.reasoning == "checking the order first" and r.text == "Sure, done. <DONE>"
    r = interpret("Answer first <think>and then I ran out of tokens")
    assert r.text == "Answer first" and r.reasoning == "and then I ran out of tokens"


def test_unclosed_final_tool_call_is_still_read():
    r = interpret('<tool_call>\n<function=create_return>\n<parameter=order_id>\nO9\n</parameter>\n', SCHEMAS)
    assert r.tool_calls[0].arguments == {"order_id": "O9"} and r.tool_calls[0].error is None


def test_malformed_calls_become_errors_not_exceptions():
    bad = [
        '<tool_call>{"name": "create_return", "arguments": {"order_id": "O1",}}</tool_call>',   # trailing comma
        "<tool_call>create_return(order_id='O1')</tool_call>",                                  # python-style
        '<tool_call>{"arguments": {}}</tool_call>',                                              # no name
        '<tool_call>{"name": "create_return", "arguments": "{not json"}</tool_call>',           # bad string args
        '<tool_call>{"name": "create_return", "arguments": [1, 2]}</tool_call>',                # args not object
        "<tool_call><function=create_return>stray text<parameter=order_id>O1</parameter></function></tool_call>",
        '<tool_call>{"name": "x"} trailing</tool_call>',
    ]
    for raw in bad:
        r = interpret(raw, SCHEMAS)
        assert len(r.tool_calls) == 1, raw
        assert r.tool_calls[0].error and r.tool_calls[0].error.startswith("could not parse"), raw


def test_failed_cast_keeps_raw_string_and_anyof_members():
    out = coerce_arguments({"quantity": "two", "amount": "1e3", "limit": "none", "meta": '{"a": 1}', "expedite": "yes"},
                           SCHEMAS["create_return"])
    assert out == {"quantity": "two", "amount": 1000.0, "limit": None, "meta": {"a": 1}, "expedite": "yes"}
    assert coerce_arguments({"x": "1"}, None) == {"x": "1"}
    assert coerce_arguments({"unknown": "1"}, SCHEMAS["create_return"]) == {"unknown": "1"}


def test_render_round_trips_through_interpret():
    args = {"order_id": "O5", "quantity": 4, "expedite": False, "tags": ["a"]}
    for fmt in ("hermes", "qwen3_xml"):
        r = interpret(render_tool_call("create_return", args, fmt), SCHEMAS)
        assert r.tool_calls[0].arguments == args, fmt


def test_plain_text_has_no_calls():
    r = interpret("Could you tell me your email address?")
    assert r.tool_calls == [] and r.text == "Could you tell me your email address?"
