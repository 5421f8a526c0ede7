"""Forced tool calls on /v1/chat/completions: `tools` with tool_choice "required" or a named
function hold the output to the call's arguments schema (structured output's grammar), and the
answer is OpenAI's tool call — whole and streamed, through the openai client, on a tiny random
LLaDA with a byte-level BPE tokenizer and a chat template. "auto" and the other misuses are 400s
by name; a conversation carrying a call and its result renders through the template."""

import json

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from checkpoints import write_llada  # noqa: E402

from unmask import LLM  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from test_server import Server

    s = Server(LLM(str(write_llada(tmp_path_factory.mktemp("tools"), bpe=True))), served_model_name="m")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _streamed(chunks):
    """Each choice's streamed tool call: (id, name, the arguments joined), and its finish reason."""
    calls, finish = {}, {}
    for ch in chunks:
        for c in ch.choices:
            for piece in c.delta.tool_calls or []:
                got = calls.setdefault(c.index, [None, None, ""])
                if piece.id is not None:
                    got[0], got[1] = piece.id, piece.function.name
                got[2] += piece.function.arguments or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return calls, finish


def test_a_named_function_is_called_with_arguments_that_fit_its_schema(client):
    kw = dict(model="m", messages=MESSAGES, tools=[WEATHER, ADD], max_tokens=48,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    calls, finish = _streamed(list(client.chat.completions.create(**kw, stream=True)))
    (cid, name, args), = calls.values()
    assert name == "get_weather" and cid.startswith("call_") and finish == {0: "tool_calls"}
    assert args == call.function.arguments  # greedy: the stream's pieces join to the whole answer


def test_required_picks_one_of_the_tools(client):
    kw = dict(model="m", messages=MESSAGES, tools=[WEATHER, ADD], tool_choice="required", max_tokens=64, n=3,
              temperature=1.0, seed=3)
    whole = client.chat.completions.create(**kw)
    by_name = {"get_weather": WEATHER, "add": ADD}
    for choice in whole.choices:
        (call,) = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls" and call.function.name in by_name
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name]["function"]["parameters"])
    calls, finish = _streamed(list(client.chat.completions.create(**kw, stream=True)))
    assert finish == {0: "tool_calls", 1: "tool_calls", 2: "tool_calls"}
    assert [(calls[i][1], json.loads(calls[i][2])) for i in range(3)] == \
        [(c.message.tool_calls[0].function.name, json.loads(c.message.tool_calls[0].function.arguments))
         for c in whole.choices]  # choice i samples with seed + i, streamed or not


def test_a_conversation_with_a_call_and_its_result(client):
    """The assistant's call and the tool's result go back through the chat template; tool_choice
    "none" answers in text."""
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    out = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], tool_choice="none",
                                         max_tokens=8)
    assert out.choices[0].message.tool_calls is None and isinstance(out.choices[0].message.content, str)


@pytest.mark.parametrize("body,needle", [
    ({"tools": [WEATHER]}, "tool_choice 'auto'"),
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice 'auto'"),
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "distinct"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "not both"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}], "tool_choice": "required"}, "name"),
])
def test_refusals_name_the_field(server, body, needle):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 32, **body})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("message,needle", [
    ({"role": "user"}, "content is required"),
    ({"role": "tool", "content": "x"}, "tool_call_id"),
    ({"role": "user", "content": "x", "tool_calls": []}, "only an assistant"),
])
def test_malformed_messages_are_400(server, message, needle):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES + [message]})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
