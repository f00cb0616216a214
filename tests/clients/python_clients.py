"""The third-party Python clients people point at a gateway, run against one: LangChain (langchain-openai
on chat completions and the Responses API, langchain-anthropic on Messages), LiteLLM's SDK (its openai,
anthropic and cohere providers) and the OpenAI Agents SDK (its Responses and chat completions models,
a function tool, plain and streamed runs). Each library is configured with the gateway's base address
and key only.

Run by tests/gateway/test_python_clients.py in a process of its own (these libraries keep clients,
caches and background threads of their own for the life of the process):

    python tests/clients/python_clients.py BASE_URL API_KEY

One JSON line per check: {"name", "ok", "detail", "requests": [[the body id of a request it made, its
prompt tokens and its completion tokens as the library reported them]]}: the test looks each up in
/v1/usage (only requests whose body id the library shows).
"""

# The libraries' own type hints miss what they take at run time (aliased fields, plain strings for
# secrets) and type their answers as unions of every shape they parse: checked here by running.
# mypy: disable-error-code="arg-type,call-arg,union-attr,index"

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

# No network here: LiteLLM reads its bundled price map instead of fetching one, and nothing reports
# to LangSmith or to OpenAI's tracing.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["LITELLM_LOG"] = "ERROR"
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
warnings.simplefilter("ignore")  # the libraries' own deprecation notices are not under test

import litellm
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_anthropic import ChatAnthropic
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from openai import AsyncOpenAI
from pydantic import BaseModel

BASE, KEY = sys.argv[1], sys.argv[2]
OPENAI_BASE = BASE + "/v1"
CHAT, CLAUDE, RESPONSES = "openai/gpt-4o-mini", "anthropic/claude-sonnet-4-5", "openai/gpt-4.1-mini"
TOOL_PROMPT = "What is the weather in Paris? [sim tool]"
litellm.suppress_debug_info = True
set_tracing_disabled(True)


class Check:
    """What one check reports besides passing: the requests it made, as the library showed them."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int, int]] = []
        self.detail = ""

    def saw(self, body_id: str, prompt: int, completion: int) -> None:
        self.requests.append((body_id, prompt, completion))


CHECKS: list[tuple[str, Callable[[Check], Any]]] = []


def check(name: str) -> Callable[[Callable[[Check], Any]], Callable[[Check], Any]]:
    def register(fn: Callable[[Check], Any]) -> Callable[[Check], Any]:
        CHECKS.append((name, fn))
        return fn

    return register


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class Person(BaseModel):
    """A person."""

    name: str
    age: int


# LangChain


def _langchain_tool_call(check: Check, llm: Any, stream: bool) -> None:
    bound = llm.bind_tools([get_weather])
    if stream:
        message = None
        for chunk in bound.stream(TOOL_PROMPT):
            message = chunk if message is None else message + chunk
    else:
        message = bound.invoke(TOOL_PROMPT)
    assert message is not None
    expect(
        [call["name"] for call in message.tool_calls] == ["get_weather"], f"tool calls {message.tool_calls}"
    )
    expect(
        isinstance(message.tool_calls[0]["args"].get("city"), str), f"args {message.tool_calls[0]['args']}"
    )
    usage = message.usage_metadata
    expect(bool(usage) and usage["input_tokens"] > 0 and usage["output_tokens"] > 0, f"usage {usage}")
    # The answer's own id, where LangChain keeps it (it names a message after its run, and a
    # streamed one keeps no other).
    if "id" in message.response_metadata:
        check.saw(message.response_metadata["id"], usage["input_tokens"], usage["output_tokens"])
    check.detail = f"{message.tool_calls[0]['args']}"


@check("langchain ChatOpenAI tools")
def _(check: Check) -> None:
    _langchain_tool_call(
        check, ChatOpenAI(model=CHAT, base_url=OPENAI_BASE, api_key=KEY, max_retries=0), False
    )


@check("langchain ChatOpenAI tools streamed")
def _(check: Check) -> None:
    llm = ChatOpenAI(model=CHAT, base_url=OPENAI_BASE, api_key=KEY, max_retries=0, stream_usage=True)
    _langchain_tool_call(check, llm, True)


@check("langchain ChatOpenAI responses api tools")
def _(check: Check) -> None:
    llm = ChatOpenAI(
        model=RESPONSES, base_url=OPENAI_BASE, api_key=KEY, max_retries=0, use_responses_api=True
    )
    _langchain_tool_call(check, llm, False)


@check("langchain ChatOpenAI responses api streamed")
def _(check: Check) -> None:
    llm = ChatOpenAI(
        model=RESPONSES, base_url=OPENAI_BASE, api_key=KEY, max_retries=0, use_responses_api=True
    )
    _langchain_tool_call(check, llm, True)


@check("langchain ChatOpenAI structured output")
def _(check: Check) -> None:
    llm = ChatOpenAI(model=CHAT, base_url=OPENAI_BASE, api_key=KEY, max_retries=0)
    for method in ("json_schema", "function_calling"):
        person = llm.with_structured_output(Person, method=method).invoke("A person, please.")
        expect(isinstance(person, Person), f"{method}: {person!r}")


@check("langchain ChatAnthropic tools")
def _(check: Check) -> None:
    _langchain_tool_call(check, ChatAnthropic(model=CLAUDE, base_url=BASE, api_key=KEY, max_retries=0), False)


@check("langchain ChatAnthropic tools streamed")
def _(check: Check) -> None:
    _langchain_tool_call(check, ChatAnthropic(model=CLAUDE, base_url=BASE, api_key=KEY, max_retries=0), True)


@check("langchain ChatAnthropic on a chat model")
def _(check: Check) -> None:
    # The Messages shape translated to a chat model's upstream.
    _langchain_tool_call(check, ChatAnthropic(model=CHAT, base_url=BASE, api_key=KEY, max_retries=0), True)


@check("langchain OpenAIEmbeddings")
def _(check: Check) -> None:
    embeddings = OpenAIEmbeddings(
        model="openai/text-embedding-3-small",
        base_url=OPENAI_BASE,
        api_key=KEY,
        dimensions=32,
        max_retries=0,
        check_embedding_ctx_length=False,  # its tokenizer's files would be downloaded otherwise
    )
    vectors = embeddings.embed_documents(["hello world", "goodbye"])
    expect([len(v) for v in vectors] == [32, 32], f"lengths {[len(v) for v in vectors]}")
    expect(len(embeddings.embed_query("hello")) == 32, "query vector")


# LiteLLM's SDK

LITELLM_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@check("litellm completion tools")
def _(check: Check) -> None:
    response = litellm.completion(
        model=CHAT,
        custom_llm_provider="openai",
        api_base=OPENAI_BASE,
        api_key=KEY,
        messages=[{"role": "user", "content": TOOL_PROMPT}],
        tools=LITELLM_TOOLS,
    )
    calls = response.choices[0].message.tool_calls
    expect(calls and calls[0].function.name == "get_weather", f"tool calls {calls}")
    expect(isinstance(json.loads(calls[0].function.arguments)["city"], str), "arguments")
    check.saw(response.id, response.usage.prompt_tokens, response.usage.completion_tokens)


@check("litellm completion streamed")
def _(check: Check) -> None:
    chunks = list(
        litellm.completion(
            model=CHAT,
            custom_llm_provider="openai",
            api_base=OPENAI_BASE,
            api_key=KEY,
            messages=[{"role": "user", "content": "Say something."}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    response = litellm.stream_chunk_builder(chunks)
    expect(bool(response.choices[0].message.content), "no content")
    expect(len({chunk.id for chunk in chunks}) == 1, f"ids {[chunk.id for chunk in chunks]}")
    check.saw(response.id, response.usage.prompt_tokens, response.usage.completion_tokens)


@check("litellm acompletion anthropic provider")
def _(check: Check) -> None:
    async def run() -> Any:
        return await litellm.acompletion(
            model=CLAUDE,
            custom_llm_provider="anthropic",
            api_base=BASE,
            api_key=KEY,
            max_tokens=200,
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": TOOL_PROMPT}],
            tools=LITELLM_TOOLS,
        )

    response = asyncio.run(run())
    calls = response.choices[0].message.tool_calls
    expect(calls and calls[0].function.name == "get_weather", f"tool calls {calls}")
    # LiteLLM gives the answer an id of its own here: the usage is checked, not looked up.
    expect(response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0, f"{response.usage}")


@check("litellm embedding, rerank and image generation")
def _(check: Check) -> None:
    embedded = litellm.embedding(
        model="openai/text-embedding-3-small",
        custom_llm_provider="openai",
        api_base=OPENAI_BASE,
        api_key=KEY,
        input=["a", "b"],
        dimensions=16,
    )
    expect([len(item["embedding"]) for item in embedded.data] == [16, 16], "embedding lengths")
    ranked = litellm.rerank(
        model="cohere/rerank-v3.5",
        custom_llm_provider="cohere",
        api_base=BASE,
        api_key=KEY,
        query="fruit",
        documents=["an apple", "a car", "a pear"],
        top_n=2,
    )
    expect(len(ranked.results) == 2, f"rerank results {ranked.results}")
    image = litellm.image_generation(
        model="openai/dall-e-3",
        custom_llm_provider="openai",
        api_base=OPENAI_BASE,
        api_key=KEY,
        prompt="a cat",
        size="1024x1024",
    )
    expect(image.data[0].url.startswith(BASE), f"image url {image.data[0].url}")


# The OpenAI Agents SDK

weather_asked: list[str] = []


@function_tool
def agent_weather(city: str) -> str:
    """The weather in a city."""
    weather_asked.append(city)
    return f"sunny in {city}"


def _agent_run(check: Check, model_of: Callable[[AsyncOpenAI], Any], streamed: bool) -> None:
    async def run() -> Any:
        client = AsyncOpenAI(base_url=OPENAI_BASE, api_key=KEY, max_retries=0)
        try:
            agent = Agent(
                name="forecaster",
                instructions="Use the tool.",
                model=model_of(client),
                tools=[agent_weather],
                model_settings=ModelSettings(include_usage=True),
            )
            if not streamed:
                return await Runner.run(agent, TOOL_PROMPT, max_turns=4)
            result = Runner.run_streamed(agent, TOOL_PROMPT, max_turns=4)
            async for _ in result.stream_events():
                pass
            return result
        finally:
            await client.close()

    weather_asked.clear()
    result = asyncio.run(run())
    expect(len(weather_asked) == 1, f"the tool ran {len(weather_asked)} times")
    expect(
        isinstance(result.final_output, str) and bool(result.final_output), f"output {result.final_output!r}"
    )
    usage = result.context_wrapper.usage
    expect(usage.requests == 2 and usage.input_tokens > 0 and usage.output_tokens > 0, f"usage {usage}")
    for response in result.raw_responses:
        if response.response_id and response.response_id.startswith(("resp_", "chatcmpl-")):
            # (the chat completions model names its answers itself: only their usage is checked)
            check.saw(response.response_id, response.usage.input_tokens, response.usage.output_tokens)


@check("agents responses model")
def _(check: Check) -> None:
    _agent_run(check, lambda client: OpenAIResponsesModel(model=RESPONSES, openai_client=client), False)


@check("agents responses model streamed")
def _(check: Check) -> None:
    _agent_run(check, lambda client: OpenAIResponsesModel(model=RESPONSES, openai_client=client), True)


@check("agents chat completions model")
def _(check: Check) -> None:
    _agent_run(check, lambda client: OpenAIChatCompletionsModel(model=CHAT, openai_client=client), False)


@check("agents chat completions model streamed on a messages model")
def _(check: Check) -> None:
    # The chat completions shape translated to a Messages-family upstream.
    _agent_run(check, lambda client: OpenAIChatCompletionsModel(model=CLAUDE, openai_client=client), True)


def main() -> None:
    for name, fn in CHECKS:
        result = Check()
        try:
            fn(result)
            ok = True
        except Exception:
            ok = False
            result.detail = traceback.format_exc(limit=6)[-3000:]
        line = {"name": name, "ok": ok, "detail": result.detail, "requests": result.requests}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
