// The playground: send a message, read the streamed answer (newline-delimited JSON events from the
// console: start, delta, done, error), show its tokens and cost. Model output is text, never markup:
// every node is made with Console.text / textContent.
"use strict";
const Playground = (() => {
  // POST `json` to `url` and call onEvent for each event of the answer as it arrives. An answer that
  // is not a stream (a JSON error before it began) becomes one error event.
  async function stream(url, json, onEvent) {
    let response;
    try {
      response = await Console.call(url, { method: "POST", json });
    } catch (err) {
      onEvent({ type: "error", code: "network", message: "The console could not be reached: " + err.message });
      return;
    }
    const type = response.headers.get("content-type") || "";
    if (!response.ok || !type.startsWith("application/x-ndjson")) {
      let message = "HTTP " + response.status, code = "api_error";
      try {
        const body = await response.json();
        message = body.error.message;
        code = body.error.code;
      } catch { /* not JSON */ }
      onEvent({ type: "error", code, message, status: response.status });
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    let ended = false;
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (err) {
        break;
      }
      if (chunk.done) break;
      pending += decoder.decode(chunk.value, { stream: true });
      let newline;
      while ((newline = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, newline).trim();
        pending = pending.slice(newline + 1);
        if (!line) continue;
        let event;
        try { event = JSON.parse(line); } catch { continue; }
        if (event.type === "done" || event.type === "error") ended = true;
        onEvent(event);
      }
    }
    if (!ended) onEvent({ type: "error", code: "network", message: "The answer was cut off." });
  }

  function tokens(e) {
    if (e.prompt_tokens == null) return "";
    return `${e.prompt_tokens} in + ${e.completion_tokens} out tokens`;
  }

  // "model · 12 in + 34 out tokens · $0.000123 · req_..."
  function meta(e, model) {
    const node = document.createElement("div");
    node.className = "meta";
    const parts = [model, tokens(e), Console.money(e.cost)].filter(Boolean);
    node.append(document.createTextNode(parts.join(" · ")));
    if (e.request_id) {
      node.append(document.createTextNode(" · "));
      node.append(Console.text("code", e.request_id));
    }
    return node;
  }

  function bubble(role, content) {
    const node = document.createElement("div");
    node.className = "msg " + role;
    node.dataset.role = role;
    node.append(Console.text("div", content, "content"));
    return node;
  }

  function init() {
    const root = document.getElementById("playground");
    const form = document.getElementById("send");
    if (!root || !form) return;
    const account = root.dataset.account;
    const chat = document.getElementById("chat");
    const input = document.getElementById("content");
    const model = document.getElementById("model");
    const button = document.getElementById("send-button");
    const answerButton = document.getElementById("answer-button");
    const status = document.getElementById("status");
    const api = `/console/a/${account}/api/conversations`;

    async function conversation(text) {
      if (root.dataset.conversation) return root.dataset.conversation;
      const response = await Console.call(api, { method: "POST", json: { title: text } });
      const body = await response.json();
      if (!response.ok) throw new Error(body.error ? body.error.message : "HTTP " + response.status);
      root.dataset.conversation = body.id;
      history.replaceState(null, "", `/console/a/${account}/playground?c=${encodeURIComponent(body.id)}`);
      const list = document.getElementById("conversation-list");
      const empty = document.getElementById("no-conversations");
      if (empty) empty.remove();
      const item = document.createElement("li");
      item.className = "on";
      const link = Console.text("a", body.title);
      link.href = `/console/a/${account}/playground?c=${encodeURIComponent(body.id)}`;
      link.dataset.conversation = body.id;
      item.append(link);
      list.prepend(item);
      return body.id;
    }

    async function send(text) {
      button.disabled = true;
      if (answerButton) answerButton.disabled = true;
      status.textContent = "";
      try {
        const id = await conversation(text || "");
        if (text) chat.append(bubble("user", text));
        const answer = bubble("assistant", "");
        answer.classList.add("streaming");
        chat.append(answer);
        const content = answer.querySelector(".content");
        const chosen = model.value;
        status.textContent = "Waiting for " + chosen + "…";
        await stream(`${api}/${encodeURIComponent(id)}/messages`, { content: text, model: chosen }, (event) => {
          if (event.type === "start") {
            status.textContent = "Streaming…";
          } else if (event.type === "delta") {
            content.append(document.createTextNode(event.text));
            answer.scrollIntoView({ block: "end" });
          } else if (event.type === "done") {
            answer.classList.remove("streaming");
            answer.dataset.done = "yes";
            answer.append(meta(event, chosen));
            status.textContent = "";
          } else if (event.type === "error") {
            answer.classList.remove("streaming");
            if (!content.textContent) answer.remove();
            else answer.append(meta(event, chosen));
            const failed = bubble("failed", `${event.message} (${event.code})`);
            failed.setAttribute("role", "alert");
            chat.append(failed);
            status.textContent = "";
          }
        });
        if (answerButton) answerButton.remove();
      } catch (err) {
        const failed = bubble("failed", err.message);
        failed.setAttribute("role", "alert");
        chat.append(failed);
      } finally {
        button.disabled = false;
        input.focus();
      }
    }

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const text = input.value;
      if (!text.trim()) return;
      input.value = "";
      send(text);
    });
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
    });
    if (answerButton) answerButton.addEventListener("click", () => send(""));
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
  return { stream, meta, tokens };
})();
