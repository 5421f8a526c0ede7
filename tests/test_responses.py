"""POST /v1/responses, OpenAI's Responses API for text, through the official openai client
(`client.responses.create`, whole and streamed) on the embedded model: the output text is the
chat completion's, the stream's typed events arrive in OpenAI's order and their deltas join to
the whole text, structured output through `text.format`, a canvas that fills is "incomplete",
and what the endpoint does not serve is a 400 by name."""

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_server import client, llm, server  # noqa: E402,F401  (its fixtures: the embedded model's server)


def test_a_response_is_the_chat_completions_answer(llm, client):
    out = client.responses.create(model="default", input="copy : red 4 owl")
    chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "copy : red 4 owl"}])
    assert out.object == "response" and out.status == "completed" and out.output_text == "red 4 owl"
    assert out.output_text == chat.choices[0].message.content
    (item,) = out.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert out.usage.input_tokens == chat.usage.prompt_tokens and out.usage.output_tokens == 3
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    listed = client.responses.create(model="default", instructions="copy",
                                     input=[{"role": "user", "content": [{"type": "input_text", "text": "sort : 7 4 0"}]}])
    assert listed.output_text == llm.generate(["sort : 7 4 0"]).results[0].text


def test_the_stream_sends_openai_s_events(client):
    kinds, deltas, final = [], [], None
    with client.responses.stream(model="default", input="json : name bob age 3 4 city rome") as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    whole = client.responses.create(model="default", input="json : name bob age 3 4 city rome")
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert "".join(deltas) == final.output_text == whole.output_text and len(deltas) >= 1


def test_structured_output_and_a_canvas_that_fills(client):
    schema = {"type": "object", "properties": {"name": {"enum": ["bob", "ann"]}}, "required": ["name"],
              "additionalProperties": False}
    out = client.responses.create(model="default", input="json : name bob age 3 4 city rome",
                                  text={"format": {"type": "json_schema", "name": "who", "schema": schema}})
    assert out.output_text.replace(" ", "") in ('{"name":"bob"}', '{"name":"ann"}')
    cut = client.responses.create(model="default", input="json : name bob age 3 4 city rome", max_output_tokens=3,
                                  extra_body={"ignore_eos": True})
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("body,needle", [
    ({"input": "copy : red", "tools": [{"type": "function", "name": "f"}]}, "tools"),
    ({"input": [{"role": "system", "content": "copy"}]}, "input needs a user message"),
    ({"input": "copy : red", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "copy : red", "text": {"format": {"type": "json_schema", "name": "x"}}}, "needs its schema"),
])
def test_refusals(server, body, needle):
    r = httpx.post(server.url + "/v1/responses", json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
