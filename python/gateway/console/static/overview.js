// The overview's charts (uPlot): requests and errors per bucket, spend per bucket (bars), spend by
// model (bars), for 24 h / 7 d / 30 d. Data from /api/stats: money arrives as decimal strings and
// becomes a Number only to be drawn; the totals shown as text keep the exact strings.
"use strict";
(() => {
  const root = document.getElementById("overview");
  if (!root || typeof uPlot === "undefined") return;
  const api = root.dataset.stats;
  const places = {
    requests: document.getElementById("chart-requests"),
    spend: document.getElementById("chart-spend"),
    models: document.getElementById("chart-models"),
  };
  const colors = { requests: "#2f6fed", errors: "#c0362c", spend: "#1a7f4b", models: "#7c4dff" };
  let charts = [];
  let current = null;

  // Axis labels for money: enough decimals to tell small amounts apart, never exponent notation.
  function dollars(value) {
    if (value === 0) return "$0";
    const size = Math.abs(value);
    const decimals = size >= 1 ? 2 : Math.min(10, Math.max(2, Math.ceil(-Math.log10(size)) + 1));
    return (value < 0 ? "-$" : "$") + size.toFixed(decimals);
  }

  function setText(id, content) {
    const node = document.getElementById(id);
    if (node) node.textContent = content;
  }

  function width(place) {
    return Math.max(320, Math.floor(place.clientWidth || root.clientWidth - 40));
  }

  const utc = (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC");

  function timeChart(place, stats, series, data, yAxis) {
    const hourly = stats.bucket_ms < 86400000;
    const options = {
      width: width(place),
      height: 220,
      tzDate: utc,
      // The whole period, every bucket drawn at its middle; amounts and counts from zero.
      scales: {
        x: { time: true, range: () => [stats.since_ms / 1000, stats.until_ms / 1000] },
        y: { range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1] },
      },
      series: [{ label: "Time (UTC)", value: hourly ? "{YYYY}-{MM}-{DD} {HH}:00" : "{YYYY}-{MM}-{DD}" }, ...series],
      axes: [
        { values: hourly ? [[3600, "{HH}:00", "\n{MMM} {D}", null, "\n{MMM} {D}", null, null, null, 1]] : undefined },
        yAxis,
      ],
      legend: { show: true },
    };
    return new uPlot(options, data, place);
  }

  function render(stats) {
    current = stats;
    charts.forEach((chart) => chart.destroy());
    charts = [];
    setText("total-requests", String(stats.totals.requests));
    setText("total-errors", String(stats.totals.errors));
    setText("total-cost", Console.money(stats.totals.cost));
    const hourly = stats.bucket_ms < 86400000;
    setText("bucket-hint", `Times are UTC; ${hourly ? "hourly" : "daily"} buckets, the last one still running.`);

    const xs = stats.buckets.map((b) => (b.start_ms + stats.bucket_ms / 2) / 1000);
    const bars = uPlot.paths.bars({ size: [0.7, 48] });
    charts.push(
      timeChart(
        places.requests,
        stats,
        [
          { label: "Requests", stroke: colors.requests, width: 2, fill: "rgba(47,111,237,0.08)", points: { show: true } },
          { label: "Errors", stroke: colors.errors, width: 2, points: { show: true } },
        ],
        [xs, stats.buckets.map((b) => b.requests), stats.buckets.map((b) => b.errors)],
        { label: "requests", size: 60, values: (u, splits) => splits.map((v) => (Number.isInteger(v) ? String(v) : "")) },
      ),
    );
    charts.push(
      timeChart(
        places.spend,
        stats,
        [{ label: "Spend", stroke: colors.spend, width: 0, fill: "rgba(26,127,75,0.7)", paths: bars, points: { show: false },
           value: (u, v) => (v == null ? "—" : dollars(v)) }],
        [xs, stats.buckets.map((b) => Number(b.cost))],
        { label: "US dollars", size: 80, values: (u, splits) => splits.map(dollars) },
      ),
    );

    renderModels(stats);
    root.dataset.rendered = String(charts.length);
    root.dataset.points = String(xs.length);
  }

  function renderModels(stats) {
    const table = document.querySelector("#by-model tbody");
    if (table) {
      table.replaceChildren();
      for (const m of stats.by_model) {
        const row = document.createElement("tr");
        row.append(Console.text("td", m.model), Console.text("td", m.requests, "num"), Console.text("td", Console.money(m.cost), "num"));
        table.append(row);
      }
      if (!stats.by_model.length) {
        const row = document.createElement("tr");
        row.className = "empty";
        const cell = Console.text("td", "No requests in this period.", "hint");
        cell.colSpan = 3;
        row.append(cell);
        table.append(row);
      }
    }
    places.models.replaceChildren();
    if (!stats.by_model.length) {
      places.models.append(Console.text("p", "No spend in this period.", "hint"));
      return;
    }
    const labels = stats.by_model.map((m) => m.model);
    const xs = labels.map((_, i) => i);
    const options = {
      width: width(places.models),
      height: 220,
      scales: {
        x: { time: false, range: () => [-0.5, labels.length - 0.5] },
        y: { range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1] },
      },
      series: [
        { label: "Model", value: (u, i) => (i == null ? "—" : labels[i] ?? "") },
        { label: "Spend", stroke: colors.models, width: 0, fill: "rgba(124,77,255,0.7)", paths: uPlot.paths.bars({ size: [0.6, 80] }),
          points: { show: false }, value: (u, v) => (v == null ? "—" : dollars(v)) },
      ],
      axes: [
        { splits: () => xs, values: (u, splits) => splits.map((i) => labels[i] ?? ""), gap: 6 },
        { label: "US dollars", size: 80, values: (u, splits) => splits.map(dollars) },
      ],
    };
    charts.push(new uPlot(options, [xs, stats.by_model.map((m) => Number(m.cost))], places.models));
  }

  async function load(range) {
    const error = document.getElementById("overview-error");
    try {
      const response = await Console.call(`${api}?range=${encodeURIComponent(range)}`);
      if (!response.ok) throw new Error(`the statistics could not be read (HTTP ${response.status})`);
      render(await response.json());
      if (error) error.hidden = true;
    } catch (exc) {
      if (error) {
        error.textContent = String(exc.message || exc);
        error.hidden = false;
      }
    }
  }

  // The range switch: links that work without the script; with it, redrawn in place.
  document.querySelectorAll(".range-switch a[data-range]").forEach((link) => {
    link.addEventListener("click", (event) => {
      event.preventDefault();
      const range = link.dataset.range;
      document.querySelectorAll(".range-switch a").forEach((a) => {
        a.classList.toggle("on", a === link);
        if (a === link) a.setAttribute("aria-current", "true");
        else a.removeAttribute("aria-current");
      });
      const heading = root.querySelector(".overview-head h2");
      if (heading) heading.textContent = `The last ${link.dataset.label || range}`;
      root.dataset.range = range;
      history.replaceState(null, "", link.href);
      load(range);
    });
  });

  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => current && render(current), 150);
  });

  load(root.dataset.range);
})();
