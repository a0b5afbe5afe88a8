// The console's pages: each reads the admin API with the session cookie and draws into <main id="page">.
// Everything is built with textContent (never innerHTML), so no stored text can become markup.
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

async function api(path) {
  const answer = await fetch("/admin/v1" + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (answer.status === 401) { window.location.assign("/console"); throw new Error("signed out"); }
  const body = await answer.json();
  if (!answer.ok) throw new Error((body.error && body.error.message) || answer.statusText);
  return body;
}

const time = (s) => (s ? new Date(s * 1000).toISOString().replace("T", " ").replace(".000Z", "Z") : "");
const money = (usd) => (usd ? "$" + usd.toFixed(usd < 0.01 ? 6 : 4) : "");
const tokens = (i, o) => (i || o ? `${i || 0} in / ${o || 0} out` : "");

function failure(main, error) {
  main.append(el("p", { class: "error", role: "alert" }, "Could not read the admin API: " + error.message));
}

// ---- Responses -------------------------------------------------------------------------------------------

const FILTERS = [
  ["project_id", "Project"], ["api_key_id", "API key"], ["model", "Model"],
];

async function responsesPage(main) {
  const params = new URLSearchParams(window.location.search);
  main.append(el("h1", {}, "Responses"));
  const form = el("form", { class: "filters", method: "get", action: "/console", role: "search" });
  for (const [name, label] of FILTERS) {
    form.append(el("label", {}, label, el("input", { name, value: params.get(name) || "" })));
  }
  const status = el("select", { name: "status" }, el("option", { value: "" }, "any"));
  for (const s of ["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]) {
    status.append(el("option", s === params.get("status") ? { value: s, selected: "" } : { value: s }, s));
  }
  form.append(el("label", {}, "Status", status));
  for (const [name, label] of [["created_after", "Created after"], ["created_before", "Created before"]]) {
    const value = params.get(name) ? new Date(Number(params.get(name)) * 1000).toISOString().slice(0, 16) : "";
    form.append(el("label", {}, label, el("input", { type: "datetime-local", "data-name": name, value })));
  }
  form.append(el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const input of form.querySelectorAll("input, select")) {
      if (!input.value) continue;
      if (input.dataset.name) query.set(input.dataset.name, Math.floor(new Date(input.value + "Z").getTime() / 1000));
      else query.set(input.name, input.value);
    }
    window.location.assign("/console?" + query.toString());
  });
  main.append(form);

  const query = new URLSearchParams();
  for (const name of ["project_id", "api_key_id", "model", "status", "created_after", "created_before", "after"]) {
    if (params.get(name)) query.set(name, params.get(name));
  }
  query.set("limit", "50");
  let page;
  try { page = await api("/responses?" + query.toString()); } catch (e) { return failure(main, e); }
  const table = el("table", {}, el("caption", { class: "muted" }, `${page.data.length} responses, newest first`),
    el("thead", {}, el("tr", {}, ["Response", "Created", "Model", "Status", "Project", "Key", "Tokens", "Cost"]
      .map((h, i) => el("th", { scope: "col", class: i >= 6 ? "num" : null }, h)))));
  const body = el("tbody");
  for (const r of page.data) {
    body.append(el("tr", {},
      el("td", {}, el("a", { href: "/console/responses/" + encodeURIComponent(r.id) }, r.id)),
      el("td", {}, time(r.created_at)), el("td", {}, r.model),
      el("td", { class: r.status === "failed" ? "error" : null }, r.status,
        r.claim_epoch > 0 ? el("span", { class: "tag takeover" }, `taken over ×${r.claim_epoch}`) : null),
      el("td", {}, r.project_id), el("td", {}, r.api_key_id || ""),
      el("td", { class: "num" }, tokens(r.input_tokens, r.output_tokens)), el("td", { class: "num" }, money(r.cost_usd))));
  }
  table.append(body);
  main.append(table);
  if (page.has_more) {
    params.set("after", page.last_id);
    main.append(el("p", {}, el("a", { href: "/console?" + params.toString(), rel: "next" }, "Older responses")));
  }
}

// ---- Timeline --------------------------------------------------------------------------------------------

// Tool calls carry their times in milliseconds; model steps only the seconds they were written and last
// changed, so a model call is placed after the step before it and ends where its batch of tools starts.
function spans(steps) {
  const out = [];
  steps.forEach((step, i) => {
    if (step.started_at_ms !== null && step.started_at_ms !== undefined) {
      out.push([step.started_at_ms, Math.max(step.ended_at_ms ?? step.started_at_ms, step.started_at_ms)]);
      return;
    }
    const start = Math.max(step.created_at * 1000, i ? out[i - 1][1] : 0);
    const batch = steps.filter((s) => s.batch === step.seq && s.started_at_ms).map((s) => s.started_at_ms);
    const end = batch.length ? Math.min(...batch) : step.updated_at * 1000;
    out.push([start, Math.max(start, end)]);
  });
  return out;
}

function stepLabel(step) {
  if (step.kind === "model") return `model · ${step.deployment || ""}`;
  if (step.kind === "tool") return `tool ${step.tool_name} · ${step.tool_source || "gateway"}`;
  return `listing · ${step.tool_source || ""}`;
}

function detailOf(step) {
  const body = el("div", { class: "step-body" });
  const facts = el("dl", { class: "facts" });
  const fact = (name, value) => { if (value !== null && value !== undefined && value !== "") facts.append(el("dt", {}, name), el("dd", {}, value)); };
  fact("State", step.state);
  fact("Outcome", step.outcome);
  fact("Deployment", step.deployment);
  fact("Tool source", step.tool_source);
  fact("Call id", step.tool_call_id);
  fact("Batch of step", step.batch);
  fact("Duration", step.duration_ms !== null && step.duration_ms !== undefined ? step.duration_ms + " ms" : null);
  fact("Sent", step.attempts > 1 ? `${step.attempts} times (re-sent)` : step.attempts ? "once" : null);
  fact("Tokens", tokens(step.input_tokens, step.output_tokens));
  fact("Cost", money(step.cost_usd));
  fact("Written", time(step.created_at));
  body.append(facts);
  const b = step.body || {};
  if (step.kind === "tool") {
    body.append(el("h4", {}, "Request"), el("pre", {}, b.call ? b.call.arguments : ""));
    if (b.outcome && b.outcome.kind === "output") body.append(el("h4", {}, "Result"), el("pre", {}, b.outcome.text));
  }
  if (step.kind === "model" && b.output) {
    if (b.output.message) body.append(el("h4", {}, "Message"), el("pre", {}, b.output.message.text));
    for (const call of b.output.tool_calls || []) {
      const handed = step.handed_back.includes(call.call_id);
      body.append(el("h4", {}, `Tool call ${call.name}`, handed ? el("span", { class: "tag handback" }, "handed back to the client") : null),
        el("pre", {}, call.arguments));
    }
  }
  if (step.error) body.append(el("h4", { class: "error" }, "Error"), el("pre", {}, step.error));
  const raw = el("details", {}, el("summary", {}, "Stored step (JSON)"), el("pre", {}, JSON.stringify(b, null, 2)));
  body.append(raw);
  return body;
}

function stepRow(step, [start, end], t0, width) {
  const left = width ? ((start - t0) / width) * 100 : 0;
  const size = width ? ((end - start) / width) * 100 : 100;
  const bar = el("span", {
    class: `bar ${step.kind}${step.outcome === "error" || step.state === "failed" ? " failed" : ""}`,
    style: null,
  });
  bar.style.left = left + "%";
  bar.style.width = Math.max(size, 0.3) + "%";
  const tags = [];
  if (step.handed_back.length) tags.push(el("span", { class: "tag handback" }, `${step.handed_back.length} handed back`));
  if (step.attempts > 1) tags.push(el("span", { class: "tag" }, `sent ×${step.attempts}`));
  const summary = el("summary", {},
    el("span", { class: "muted" }, "#" + step.seq),
    el("span", {}, stepLabel(step), tags),
    el("span", { class: "track", role: "img", "aria-label": `${step.kind} step from ${start - t0} ms to ${end - t0} ms` }, bar),
    el("span", { class: "muted" }, step.duration_ms !== null && step.duration_ms !== undefined ? step.duration_ms + " ms" : (step.outcome || step.state)));
  const details = el("details", { class: "step", id: "step-" + step.seq }, summary);
  // The body is built when first opened: a response with hundreds of steps draws only its rows.
  details.addEventListener("toggle", () => { if (details.open && details.childElementCount === 1) details.append(detailOf(step)); });
  return details;
}

async function timelinePage(main) {
  const id = main.dataset.id;
  main.append(el("h1", {}, "Response ", el("code", {}, id)));
  let page;
  try { page = await api("/responses/" + encodeURIComponent(id) + "/steps"); } catch (e) { return failure(main, e); }
  const r = page.response;
  const facts = el("dl", { class: "facts" });
  for (const [name, value] of [
    ["Model", r.model], ["Status", r.status + (r.error_code ? ` (${r.error_code})` : "")], ["Project", r.project_id],
    ["API key", r.api_key_id || ""], ["Created", time(r.created_at)], ["Completed", time(r.completed_at)],
    ["Owner", r.owner || "none (not running)"],
    ["Takeovers", r.claim_epoch > 0 ? `${r.claim_epoch} (claim epoch)` : "none"],
    ["Tokens", tokens(r.input_tokens, r.output_tokens)], ["Cost", money(r.cost_usd)],
    ["Ended by", r.handed_back ? "handing tool calls back to the client" : ""],
  ]) if (value) facts.append(el("dt", {}, name), el("dd", {}, value));
  main.append(facts);

  const times = spans(page.data);
  const t0 = Math.min(...times.map((s) => s[0]));
  const width = Math.max(...times.map((s) => s[1])) - t0;
  main.append(el("h2", {}, `Timeline: ${page.data.length} steps over ${width} ms`),
    el("p", { class: "muted" }, "Tool calls are drawn from their own times (ms); model calls between them, from the whole seconds their steps were written."));
  const timeline = el("div", { class: "timeline" });
  let batch = null;
  page.data.forEach((step, i) => {
    if (step.kind === "tool" && step.batch !== null && step.batch !== undefined) {
      if (!batch || batch.dataset.batch !== String(step.batch)) {
        batch = el("div", { class: "batch", "data-batch": step.batch, role: "group", "aria-label": `Tool calls of model step ${step.batch}` },
          el("div", { class: "batch-label" }, `Tool calls of model step #${step.batch}, run together`));
        timeline.append(batch);
      }
      batch.append(stepRow(step, times[i], t0, width));
    } else {
      batch = null;
      timeline.append(stepRow(step, times[i], t0, width));
    }
  });
  main.append(timeline);

  const last = [...page.data].reverse().find((s) => s.kind === "model" && s.body && s.body.output);
  if (last && last.body.output.message) {
    main.append(el("h2", {}, "Final output"), el("pre", { class: "final-output" }, last.body.output.message.text));
  }
}

// ---- Tool sources ----------------------------------------------------------------------------------------

async function toolsPage(main) {
  main.append(el("h1", {}, "Tool sources"));
  let sources, health;
  try {
    sources = await api("/tool_sources");
    health = await api("/tool_sources/health");
  } catch (e) { return failure(main, e); }
  const byName = new Map(health.data.map((h) => [h.tool_source, h]));
  main.append(el("p", { class: "muted" }, `Calls over the last ${Math.round(health.window_seconds / 3600)} hours; breakers as this replica sees them.`));
  const table = el("table", {}, el("thead", {}, el("tr", {},
    ["Source", "Kind", "Calls", "Errors", "Mean", "p50", "p95", "Breaker"].map((h, i) => el("th", { scope: "col", class: i >= 2 && i < 7 ? "num" : null }, h)))));
  const body = el("tbody");
  for (const s of sources.data) {
    const h = byName.get(s.name) || {};
    const ms = (v) => (v === null || v === undefined ? "" : Math.round(v) + " ms");
    body.append(el("tr", {}, el("td", {}, s.name), el("td", {}, s.kind || ""),
      el("td", { class: "num" }, h.calls || 0), el("td", { class: h.errors ? "num error" : "num" }, h.errors || 0),
      el("td", { class: "num" }, ms(h.mean_ms)), el("td", { class: "num" }, ms(h.p50_ms)), el("td", { class: "num" }, ms(h.p95_ms)),
      el("td", { class: h.breaker === "open" ? "error" : null }, h.breaker || "closed")));
  }
  table.append(body);
  main.append(table);
}

// ---- Usage -----------------------------------------------------------------------------------------------

function barChart(title, rows, label, value) {
  const max = Math.max(1, ...rows.map(value));
  const plot = 560, height = 140;
  const step = plot / Math.max(rows.length, 8);
  const chart = svg("svg", { class: "chart", viewBox: `0 0 600 ${height + 40}`, role: "img", "aria-label": title });
  rows.forEach((row, i) => {
    const h = (value(row) / max) * height;
    const x = 30 + i * step;
    const rect = svg("rect", { class: "bar-tokens", x, y: height - h + 10, width: step * 0.8, height: Math.max(h, 1) });
    rect.append(svg("title", {}, `${label(row)}: ${value(row)}`));
    chart.append(rect, svg("text", { x, y: height + 25 }, label(row)), svg("text", { x, y: height - h + 5 }, Number.isInteger(value(row)) ? value(row) : value(row).toFixed(4)));
  });
  return chart;
}

function usageTable(caption, rows, key) {
  const table = el("table", {}, el("caption", {}, caption), el("thead", {}, el("tr", {},
    [key, "Model calls", "Tool calls", "Input tokens", "Output tokens", "Cost"].map((h, i) => el("th", { scope: "col", class: i ? "num" : null }, h)))));
  const body = el("tbody");
  for (const b of rows) {
    body.append(el("tr", {}, el("td", {}, b.project_id || b.api_key_id || "(none)"), el("td", { class: "num" }, b.model_calls),
      el("td", { class: "num" }, b.tool_calls), el("td", { class: "num" }, b.input_tokens), el("td", { class: "num" }, b.output_tokens),
      el("td", { class: "num" }, money(b.cost_usd) || "$0")));
  }
  table.append(body);
  return table;
}

async function usagePage(main) {
  main.append(el("h1", {}, "Usage, last 30 days"));
  let days, projects, keys;
  try {
    [days, projects, keys] = await Promise.all([
      api("/usage?group_by=day&limit=31"), api("/usage?group_by=project&limit=100"), api("/usage?group_by=api_key&limit=100")]);
  } catch (e) { return failure(main, e); }
  const day = (b) => new Date(b.start_time * 1000).toISOString().slice(5, 10);
  main.append(el("h2", {}, "Tokens per day"), barChart("Tokens per day", days.data, day, (b) => b.total_tokens));
  main.append(el("h2", {}, "Cost per day"), barChart("Cost per day (USD)", days.data, day, (b) => b.cost_usd));
  main.append(el("h2", {}, "Per project"), barChart("Tokens per project", projects.data, (b) => b.project_id, (b) => b.total_tokens),
    usageTable("Usage per project", projects.data, "Project"));
  main.append(el("h2", {}, "Per API key"), barChart("Tokens per API key", keys.data, (b) => b.api_key_id || "(none)", (b) => b.total_tokens),
    usageTable("Usage per API key", keys.data, "API key"));
}

const PAGES = { responses: responsesPage, timeline: timelinePage, tools: toolsPage, usage: usagePage };

document.addEventListener("DOMContentLoaded", () => {
  const main = document.getElementById("page");
  if (main && PAGES[main.dataset.page]) {
    main.setAttribute("aria-busy", "true");
    PAGES[main.dataset.page](main).finally(() => main.setAttribute("aria-busy", "false"));
  }
});
