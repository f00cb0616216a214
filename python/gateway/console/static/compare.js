// Compare: one prompt to two or three models at once, each streamed into its own column with its
// time to first token, total time, tokens and cost (Playground.stream reads the events). Text only.
"use strict";
(() => {
  const form = document.getElementById("compare");
  if (!form) return;
  const account = form.dataset.account;
  const results = document.getElementById("results");
  const error = document.getElementById("compare-error");
  const button = document.getElementById("compare-button");

  function figure(list, label, value) {
    list.append(Console.text("dt", label), Console.text("dd", value));
  }

  function column(model) {
    const node = document.createElement("section");
    node.className = "card column";
    node.dataset.model = model;
    node.append(Console.text("h2", model));
    const answer = document.createElement("div");
    answer.className = "answer";
    const content = Console.text("div", "", "content");
    answer.append(content);
    node.append(answer);
    const figures = document.createElement("dl");
    figures.className = "figures";
    node.append(figures);
    return { node, content, figures };
  }

  function finish(col, event) {
    const ms = (v) => (v == null ? "—" : v + " ms");
    figure(col.figures, "first token", ms(event.ttft_ms));
    figure(col.figures, "total", ms(event.total_ms));
    figure(col.figures, "tokens", Playground.tokens(event) || "—");
    figure(col.figures, "cost", Console.money(event.cost));
    if (event.request_id) {
      col.figures.append(Console.text("dt", "request"));
      const dd = document.createElement("dd");
      dd.append(Console.text("code", event.request_id));
      col.figures.append(dd);
    }
    col.node.dataset.done = "yes";
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    const models = [...form.querySelectorAll(".model-choice")].map((s) => s.value).filter(Boolean);
    if (new Set(models).size !== models.length) {
      error.textContent = "Choose different models.";
      return;
    }
    if (models.length < 2) {
      error.textContent = "Choose at least two models.";
      return;
    }
    const prompt = document.getElementById("prompt").value;
    if (!prompt.trim()) return;
    button.disabled = true;
    results.replaceChildren();
    const runs = models.map((model) => {
      const col = column(model);
      results.append(col.node);
      return Playground.stream(`/console/a/${account}/api/compare`, { model, prompt }, (e) => {
        if (e.type === "delta") {
          col.content.append(document.createTextNode(e.text));
        } else if (e.type === "done") {
          finish(col, e);
        } else if (e.type === "error") {
          col.node.classList.add("failed");
          const failed = Console.text("p", `${e.message} (${e.code})`, "error");
          failed.setAttribute("role", "alert");
          col.node.querySelector(".answer").append(failed);
          finish(col, e);
        }
      });
    });
    await Promise.allSettled(runs);
    button.disabled = false;
  });
})();
