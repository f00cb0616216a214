// The Vercel AI SDK (a strict client: it validates every answer and every streamed chunk against its
// own schemas) against a running gateway, on the three text shapes. Run by
// tests/gateway/test_ai_sdk.py: node ai_sdk_clients.mjs <gateway url> <api key>
// Prints one JSON line per check ({name, ok, detail}) and exits 1 if any failed.
import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";
import { generateImage, generateObject, generateText, stepCountIs, streamObject, streamText, tool } from "ai";
import { z } from "zod";

const [base, key] = process.argv.slice(2);
if (!base || !key) {
  console.error("usage: node ai_sdk_clients.mjs <gateway url> <api key>");
  process.exit(2);
}

const GPT = "openai/gpt-4o-mini";
const CLAUDE = "anthropic/claude-sonnet-4-5";
const RESPONSES = "openai/gpt-4.1-mini";

// Clients take {base_url}/v1 (spec 1.2); the anthropic provider adds /messages to it.
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: key });
const anthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: key });
const badKeyAnthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: "sk-not-a-key" });
// ... or to the root, as spec 1.2 gives Shape B clients (served as /messages too).
const anthropicAtRoot = createAnthropic({ baseURL: base, apiKey: key });

// Enough kinds to show a value built for the schema: nested object, array, enum, integer bounds.
const Forecast = z.object({
  city: z.string(),
  days: z.number().int().min(1).max(14),
  unit: z.enum(["celsius", "fahrenheit"]),
  tags: z.array(z.string()),
  detail: z.object({ sunny: z.boolean(), score: z.number() }),
});

const results = [];

async function check(name, fn) {
  try {
    const detail = await fn();
    results.push({ name, ok: true, detail: detail ?? null });
  } catch (error) {
    results.push({ name, ok: false, detail: String(error?.stack ?? error) });
  }
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

async function plainText(model) {
  const { text, usage, finishReason } = await generateText({ model, prompt: "Say hello", maxRetries: 0 });
  expect(text.trim().length > 0, "no text");
  expect(usage.inputTokens > 0 && usage.outputTokens > 0, `usage ${JSON.stringify(usage)}`);
  return { text, usage, finishReason };
}

async function streamedText(model) {
  const errors = [];
  const result = streamText({
    model,
    prompt: "Say hello [sim tokens=7]",
    maxRetries: 0,
    onError: ({ error }) => errors.push(String(error)),
  });
  let text = "";
  for await (const part of result.textStream) text += part;
  const usage = await result.usage;
  expect(errors.length === 0, `stream errors: ${errors.join("; ")}`);
  expect(text.trim().split(/\s+/).length === 7, `text ${JSON.stringify(text)}`);
  expect(usage.inputTokens > 0 && usage.outputTokens > 0, `usage ${JSON.stringify(usage)}`);
  return { text, usage };
}

async function plainObject(model, providerOptions) {
  const { object, usage } = await generateObject({
    model,
    schema: Forecast,
    prompt: "The forecast for Paris",
    maxRetries: 0,
    providerOptions,
  });
  Forecast.parse(object);
  expect(usage.inputTokens > 0, `usage ${JSON.stringify(usage)}`);
  return object;
}

async function streamedObject(model, providerOptions) {
  const errors = [];
  const result = streamObject({
    model,
    schema: Forecast,
    prompt: "The forecast for Oslo",
    maxRetries: 0,
    providerOptions,
    onError: ({ error }) => errors.push(String(error)),
  });
  for await (const _ of result.partialObjectStream) {
    // the partial objects; the whole one is checked below
  }
  const object = await result.object;
  expect(errors.length === 0, `stream errors: ${errors.join("; ")}`);
  Forecast.parse(object);
  return object;
}

// A stream the model breaks after two pieces: the SDK must report an error (not a parse failure of
// the chunk) carrying the gateway's message.
async function midStreamError(model) {
  const errors = [];
  const result = streamText({
    model,
    prompt: "Break [sim tokens=8 error_after=2]",
    maxRetries: 0,
    onError: ({ error }) => errors.push(error),
  });
  const parts = [];
  for await (const part of result.fullStream) parts.push(part);
  const text = parts.filter((p) => p.type === "text-delta").map((p) => p.text).join("");
  const reported = parts.filter((p) => p.type === "error").map((p) => p.error);
  expect(text.trim().length > 0, "no text before the error");
  expect(reported.length === 1, `error parts: ${reported.length}`);
  const error = reported[0];
  const described = JSON.stringify(error) + String(error?.message ?? error);
  expect(described.includes("The model failed during the stream"), `error: ${described}`);
  expect(!/Type validation failed|Invalid JSON response/i.test(described), `chunk rejected: ${described}`);
  return described.slice(0, 300);
}

// A tool loop, then a second turn, with the SDK's defaults: on the responses API its `store` is
// true, so it sends earlier turns' output as item_references (the gateway keeps a chat model's
// answers to resolve them), and a turn may name the one before by previousResponseId.
async function toolLoopAndNextTurn(model) {
  const tools = {
    get_weather: tool({
      description: "The forecast for a city",
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => `sunny in ${city}`,
    }),
  };
  const prompt = "Weather in Paris? [sim tool]";
  const first = await generateText({ model, tools, prompt, stopWhen: stepCountIs(3), maxRetries: 0 });
  expect(first.steps.length === 2, `steps ${first.steps.length}`);
  expect(first.steps[0].toolCalls.length === 1, "no tool call in the first step");
  expect(first.text.trim().length > 0, "no text after the tool result");
  const messages = [{ role: "user", content: prompt }, ...first.response.messages];
  const sent = JSON.stringify(messages);
  expect(sent.includes("itemId"), `no item ids to reference: ${sent.slice(0, 300)}`);
  const second = await generateText({
    model,
    tools,
    messages: [...messages, { role: "user", content: "And tomorrow?" }],
    maxRetries: 0,
  });
  expect(second.text.trim().length > 0, "no text in the second turn");
  const third = await generateText({
    model,
    prompt: "Thanks",
    providerOptions: { openai: { previousResponseId: second.providerMetadata.openai.responseId } },
    maxRetries: 0,
  });
  expect(third.text.trim().length > 0, "no text in the third turn");
  return { first: first.text, second: second.text, third: third.text };
}

// Chat completions: the openai provider's chat model.
await check("chat generateText", () => plainText(openai.chat(GPT)));
await check("chat streamText", () => streamedText(openai.chat(GPT)));
await check("chat generateObject", () => plainObject(openai.chat(GPT)));
await check("chat streamObject", () => streamedObject(openai.chat(GPT)));
await check("chat mid-stream error", () => midStreamError(openai.chat(GPT)));
// ... serving a messages-family model (translated both ways, structured output included).
await check("chat->claude generateText", () => plainText(openai.chat(CLAUDE)));
await check("chat->claude streamText", () => streamedText(openai.chat(CLAUDE)));
await check("chat->claude generateObject", () => plainObject(openai.chat(CLAUDE)));
await check("chat->claude streamObject", () => streamedObject(openai.chat(CLAUDE)));

// Responses: the openai provider's responses model.
await check("responses generateText", () => plainText(openai.responses(RESPONSES)));
await check("responses streamText", () => streamedText(openai.responses(RESPONSES)));
await check("responses generateObject", () => plainObject(openai.responses(RESPONSES)));
await check("responses streamObject", () => streamedObject(openai.responses(RESPONSES)));
await check("responses mid-stream error", () => midStreamError(openai.responses(RESPONSES)));
// Its upstream keeps the items: the item_references the SDK sends must be of this account's responses.
await check("responses tool loop and next turn", () => toolLoopAndNextTurn(openai.responses(RESPONSES)));
// ... serving a chat model (translated: a Response and its stream built from chat completions).
await check("responses->gpt generateText", () => plainText(openai.responses(GPT)));
await check("responses->gpt streamText", () => streamedText(openai.responses(GPT)));
await check("responses->gpt generateObject", () => plainObject(openai.responses(GPT)));
await check("responses->gpt streamObject", () => streamedObject(openai.responses(GPT)));
await check("responses->gpt mid-stream error", () => midStreamError(openai.responses(GPT)));
await check("responses->gpt tool loop and next turn", () => toolLoopAndNextTurn(openai.responses(GPT)));
// ... serving a messages model (Claude): the default `openai(model)` of the SDK is the responses one.
await check("responses->claude generateText", () => plainText(openai(CLAUDE)));
await check("responses->claude streamText", () => streamedText(openai.responses(CLAUDE)));
await check("responses->claude generateObject", () => plainObject(openai.responses(CLAUDE)));
await check("responses->claude streamObject", () => streamedObject(openai.responses(CLAUDE)));
await check("responses->claude mid-stream error", () => midStreamError(openai.responses(CLAUDE)));
await check("responses->claude tool loop and next turn", () => toolLoopAndNextTurn(openai.responses(CLAUDE)));

// Messages: the anthropic provider (output_config.format for structured output).
await check("messages generateText", () => plainText(anthropic(CLAUDE)));
await check("messages streamText", () => streamedText(anthropic(CLAUDE)));
await check("messages at the root generateText", () => plainText(anthropicAtRoot(CLAUDE)));
await check("messages at the root streamText", () => streamedText(anthropicAtRoot(CLAUDE)));
await check("messages generateObject", () => plainObject(anthropic(CLAUDE)));
await check("messages streamObject", () => streamedObject(anthropic(CLAUDE)));
await check("messages mid-stream error", () => midStreamError(anthropic(CLAUDE)));
// ... serving a chat model. The SDK knows nothing of this model's abilities, so it is told to use
// output_config.format rather than its fallback of a forced tool.
const outputFormat = { anthropic: { structuredOutputMode: "outputFormat" } };
await check("messages->gpt generateText", () => plainText(anthropic(GPT)));
await check("messages->gpt streamText", () => streamedText(anthropic(GPT)));
await check("messages->gpt generateObject", () => plainObject(anthropic(GPT), outputFormat));
await check("messages->gpt streamObject", () => streamedObject(anthropic(GPT), outputFormat));
await check("messages->gpt mid-stream error", () => midStreamError(anthropic(GPT)));

// An error answer on /v1/messages that the anthropic provider can read (not just "401: Unauthorized").
await check("messages error body", async () => {
  try {
    await generateText({ model: badKeyAnthropic(CLAUDE), prompt: "hi", maxRetries: 0 });
  } catch (error) {
    expect(error.statusCode === 401, `status ${error.statusCode}`);
    expect(/Invalid API key/.test(error.message), `message ${error.message}`);
    return { message: error.message, data: error.data ?? null };
  }
  throw new Error("no error");
});

// generateImage reads each image's base64 (it asks DALL-E for b64_json, and GPT image models answer
// so unasked): the gateway gives it beside the URL it serves.
for (const model of ["openai/dall-e-3", "openai/gpt-image-1"]) {
  await check(`images ${model} generateImage`, async () => {
    const { image } = await generateImage({ model: openai.image(model), prompt: "a kite", maxRetries: 0 });
    const png = [0x89, 0x50, 0x4e, 0x47];
    expect(png.every((byte, i) => image.uint8Array[i] === byte), "not a PNG");
    return { bytes: image.uint8Array.length };
  });
}

for (const result of results) console.log(JSON.stringify(result));
process.exit(results.every((r) => r.ok) ? 0 : 1);
