// Logs: new requests appear without a reload. Every 2 s (while the tab is visible) the page asks
// /api/logs, with its own filters, for the entries newer than the newest it shows and puts them
// on top, highlighted. Every cell is set as text: ids, models and key names are never markup.
"use strict";
(() => {
  const table = document.getElementById("logs");
  const body = document.getElementById("log-rows");
  if (!table || !body || !table.dataset.poll) return;
  const pollUrl = table.dataset.poll;
  const EVERY_MS = 2000;
  const MAX_ROWS = 500; // the live page keeps at most this many rows
  let newest = table.dataset.newest || "";
  let timer = null;
  let stopped = false;

  function cell(content, className, title) {
    const td = Console.text("td", content, className);
    if (title) td.title = title;
    return td;
  }

  function line(r) {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    const time = document.createElement("td");
    const link = Console.text("a", r.time);
    link.href = r.href;
    link.title = r.id;
    time.append(link);
    tr.append(
      time,
      cell(r.status, `num ${r.status_class}`, r.error_code),
      cell(r.latency, "num"),
      cell(r.cost, "num", r.cost_exact || ""),
      cell(r.tokens, "num"),
      cell(r.size, "num"),
      cell(r.model),
      cell(r.key),
      cell(r.endpoint, "mono"),
    );
    return tr;
  }

  async function poll() {
    timer = null;
    if (stopped) return;
    if (document.hidden) return schedule();
    const separator = pollUrl.includes("?") ? "&" : "?";
    const url = newest ? `${pollUrl}${separator}since_id=${encodeURIComponent(newest)}` : pollUrl;
    try {
      const response = await Console.call(url);
      if (response.status === 401 || response.status === 403 || response.status === 404) {
        stopped = true; // signed out, or the account is gone: stop asking
        const status = document.getElementById("live-status");
        if (status) status.textContent = "Live updates stopped: reload the page.";
        return;
      }
      if (response.ok) {
        const page = await response.json();
        const fresh = page.data.filter((r) => !body.querySelector(`tr[data-id="${CSS.escape(r.id)}"]`));
        if (fresh.length) {
          const rows = fresh.map(line);
          rows.forEach((tr) => tr.classList.add("new"));
          body.prepend(...rows);
          newest = page.data[0].id;
          table.dataset.newest = newest;
          while (body.rows.length > MAX_ROWS) body.lastElementChild.remove();
          const empty = document.getElementById("no-logs");
          if (empty) empty.hidden = true;
        }
        const gap = document.getElementById("live-gap");
        if (gap && page.gap) gap.hidden = false;
      }
    } catch {
      // the network blinked: try again at the next tick
    }
    schedule();
  }

  function schedule() {
    if (!stopped && timer === null) timer = setTimeout(poll, EVERY_MS);
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer === null) poll();
  });
  schedule();
})();
