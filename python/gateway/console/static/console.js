// Shared by every console page: the CSRF token for scripts' requests, copy buttons, escaping.
"use strict";
const Console = (() => {
  const csrf = document.querySelector('meta[name="csrf-token"]')?.content || "";

  // fetch with the session's CSRF token on every state-changing request.
  async function call(url, options = {}) {
    const headers = new Headers(options.headers || {});
    if (options.method && options.method !== "GET") headers.set("X-CSRF-Token", csrf);
    if (options.json !== undefined) {
      headers.set("Content-Type", "application/json");
      options.body = JSON.stringify(options.json);
    }
    return fetch(url, { ...options, headers, credentials: "same-origin" });
  }

  // Text only: model output and prompts are hostile input, never markup.
  function text(tag, content, className) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    node.textContent = content == null ? "" : String(content);
    return node;
  }

  // Exact, as render.money writes it: the API's decimal text to its last digit, at least cents.
  function money(value) {
    if (value == null || value === "") return "—";
    const text = typeof value === "number" ? value.toFixed(12) : String(value);
    const negative = text.startsWith("-");
    const [whole, fraction = ""] = text.replace(/^-/, "").split(".");
    const digits = fraction.replace(/0+$/, "").padEnd(2, "0");
    return (negative && /[1-9]/.test(text) ? "-$" : "$") + whole + "." + digits;
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    try {
      await navigator.clipboard.writeText(source.textContent.trim());
      button.textContent = "Copied";
    } catch {
      const range = document.createRange();
      range.selectNodeContents(source);
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      button.textContent = "Selected: press Ctrl+C";
    }
  });

  // Forms marked data-confirm ask first (rotate, delete).
  document.addEventListener("submit", (event) => {
    const message = event.target.dataset.confirm;
    if (message && !window.confirm(message)) event.preventDefault();
  });

  return { csrf, call, text, money };
})();
