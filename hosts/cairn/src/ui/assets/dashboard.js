// Cairn dashboard: the only script. It draws a run's metric curves as inline SVG from
// /api/curves and redraws them every 2 s, and refreshes every element with a data-live URL
// (the gateway tables) from that URL every 2 s. Plain browser JavaScript, no dependencies.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const W = 360, H = 200, PAD_L = 52, PAD_R = 10, PAD_T = 10, PAD_B = 26;
// Above this many points a curve is drawn as a line only (no point markers).
const MAX_MARKERS = 2000;

function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(x) {
  if (!isFinite(x)) return "-";
  if (x === Math.trunc(x) && Math.abs(x) < 1e6) return String(x);
  const a = Math.abs(x);
  if (a >= 1e-3 && a < 1e5) return String(Number(x.toPrecision(4)));
  return x.toExponential(2);
}

// One chart: an <svg class="curve" data-key=...> with a <polyline> and one <circle> per point
// carrying data-step and data-value (the exact numbers of the JSON).
function chart(key, points) {
  const svg = el("svg", { class: "curve", "data-key": key, "data-count": points.length,
    viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
  svg.appendChild(el("title", {}, key));
  const box = el("rect", { x: PAD_L, y: PAD_T, width: W - PAD_L - PAD_R,
    height: H - PAD_T - PAD_B, class: "frame" });
  svg.appendChild(box);
  if (points.length === 0) {
    svg.appendChild(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" },
      "no values yet"));
    return svg;
  }
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const [x, y] of points) {
    x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
  }
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) > 0 ? Math.abs(y0) * 0.1 : 1; y0 -= d; y1 += d; }
  const sx = x => PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R);
  const sy = y => H - PAD_B - (y - y0) / (y1 - y0) * (H - PAD_T - PAD_B);
  for (const t of [0, 0.5, 1]) {
    const v = y0 + t * (y1 - y0);
    svg.appendChild(el("line", { x1: PAD_L, x2: W - PAD_R, y1: sy(v), y2: sy(v), class: "grid" }));
    svg.appendChild(el("text", { x: PAD_L - 4, y: sy(v) + 4, "text-anchor": "end", class: "tick" },
      fmt(v)));
  }
  svg.appendChild(el("text", { x: PAD_L, y: H - 8, class: "tick" }, "step " + fmt(x0)));
  svg.appendChild(el("text", { x: W - PAD_R, y: H - 8, "text-anchor": "end", class: "tick" },
    fmt(x1)));
  svg.appendChild(el("polyline", { class: "line",
    points: points.map(([x, y]) => `${sx(x).toFixed(2)},${sy(y).toFixed(2)}`).join(" ") }));
  if (points.length <= MAX_MARKERS) {
    const r = points.length <= 60 ? 2.5 : 1.2;
    for (const [x, y] of points) {
      const c = el("circle", { cx: sx(x).toFixed(2), cy: sy(y).toFixed(2), r,
        class: "point", "data-step": x, "data-value": y });
      c.appendChild(el("title", {}, `${key} at step ${x}: ${y}`));
      svg.appendChild(c);
    }
  }
  return svg;
}

function startCurves(section) {
  const charts = section.querySelector("#charts");
  const status = section.querySelector("#curves-status");
  const boxes = Array.from(section.querySelectorAll(".keys input[type=checkbox]"));
  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    const keys = boxes.filter(b => b.checked).map(b => b.value);
    const url = `${section.dataset.api}?run=${encodeURIComponent(section.dataset.run)}` +
      `&keys=${encodeURIComponent(keys.join(","))}`;
    try {
      const r = await fetch(url, { cache: "no-store" });
      const data = await r.json();
      if (!r.ok) throw new Error(data.error || r.statusText);
      const figs = data.curves.map(c => {
        const fig = document.createElement("figure");
        fig.appendChild(chart(c.key, c.points));
        const cap = document.createElement("figcaption");
        const last = c.points.length ? fmt(c.points[c.points.length - 1][1]) : "-";
        cap.textContent = `${c.key} (last ${last})`;
        fig.appendChild(cap);
        return fig;
      });
      charts.replaceChildren(...figs);
      status.textContent = `${data.lines} metric lines, ${data.eval_lines} evaluations` +
        (data.problems.length ? ` · ${data.problems.join("; ")}` : "") +
        ` · updated ${new Date().toLocaleTimeString()}`;
      status.dataset.lines = data.lines;
      status.classList.remove("error");
    } catch (e) {
      status.textContent = `could not refresh: ${e.message}`;
      status.classList.add("error");
    }
    timer = setTimeout(refresh, POLL_MS);
  }
  boxes.forEach(b => b.addEventListener("change", refresh));
  refresh();
}

function startLive(node) {
  async function refresh() {
    try {
      const r = await fetch(node.dataset.live, { cache: "no-store" });
      if (r.ok) {
        node.innerHTML = await r.text();
        node.dataset.refreshed = String(Number(node.dataset.refreshed || 0) + 1);
      }
    } catch (e) { /* the next poll tries again */ }
    setTimeout(refresh, POLL_MS);
  }
  setTimeout(refresh, POLL_MS);
}

const curves = document.getElementById("curves");
if (curves) startCurves(curves);
document.querySelectorAll("[data-live]").forEach(startLive);
