// Drives the dashboard in headless Chromium (Debian's /usr/bin/chromium through playwright-core)
// and checks what it shows against values the Rust test read independently of the page.
//
//   node check.mjs URL EXPECTED.json
//
// EXPECTED.json (written by hosts/cairn/tests/it/ui.rs):
//   runs:    the run names the index lists
//   run:     the run to open
//   curves:  { key: [[step, value], ...] }      the points every curve must plot
//   episode: { path, turns: [{ turn, ids, texts, logprobs, advantages, mask }] }
//   step:    { path, groups: [{ group_id, rewards: [...] }] }
//   live:    { run, metrics, line, key, step, value }  append `line` to `metrics`, then the
//            curve `key` must gain the point (step, value) without a reload
// Prints one line per check; exits 1 with the reason at the first failure.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const [url, expectedPath] = process.argv.slice(2);
if (!url || !expectedPath) {
  console.error("usage: node check.mjs URL EXPECTED.json");
  process.exit(2);
}
const expected = JSON.parse(fs.readFileSync(expectedPath, "utf8"));
const base = url.replace(/\/$/, "");

function fail(message) {
  throw new Error(message);
}

function same(a, b, what) {
  const sa = JSON.stringify(a), sb = JSON.stringify(b);
  if (sa !== sb) fail(`${what}: the page shows ${sa}, expected ${sb}`);
}

const profile = fs.mkdtempSync(path.join(os.tmpdir(), "cairn-ui-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const errors = [];
let code = 0;
try {
  const page = await context.newPage();
  page.on("pageerror", e => errors.push(`page error: ${e.message}`));
  page.on("console", m => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });
  const open = async (p) => {
    const r = await page.goto(base + p);
    if (!r || r.status() !== 200) fail(`GET ${p}: status ${r && r.status()}`);
  };

  // The run list.
  await open("/");
  const listed = await page.$$eval("#runs tr td:first-child a", as => as.map(a => a.textContent));
  same(listed, expected.runs, "run list");
  console.log(`ok: the index lists ${listed.length} runs`);

  // The curves: every point of every expected curve, exactly.
  await open(`/run?run=${encodeURIComponent(expected.run)}`);
  for (const [key, points] of Object.entries(expected.curves)) {
    const sel = `svg.curve[data-key="${key}"]`;
    await page.waitForSelector(sel, { timeout: 20000 });
    const shown = await page.$$eval(`${sel} circle.point`, cs =>
      cs.map(c => [Number(c.dataset.step), Number(c.dataset.value)]));
    same(shown, points, `curve ${key}`);
    console.log(`ok: curve ${key} plots its ${points.length} points`);
  }

  // An episode, token by token.
  await open(expected.episode.path);
  const turns = await page.$$eval(".turn", ts => ts.map(t => ({
    turn: Number(t.dataset.turn),
    ids: Array.from(t.querySelectorAll(".tokens .tok")).map(s => Number(s.dataset.id)),
    texts: Array.from(t.querySelectorAll(".tokens .tok")).map(s => s.textContent),
    logprobs: Array.from(t.querySelectorAll(".tokens .tok")).map(s => Number(s.dataset.logprob)),
    advantages: Array.from(t.querySelectorAll(".tokens .tok")).map(s => Number(s.dataset.advantage)),
    mask: Array.from(t.querySelectorAll(".tokens .tok")).map(s => Number(s.dataset.mask)),
    masked_class: Array.from(t.querySelectorAll(".tokens .tok")).map(s => s.classList.contains("masked") ? 0 : 1),
    titles: Array.from(t.querySelectorAll(".tokens .tok")).map(s => s.title),
    colours: Array.from(t.querySelectorAll(".tokens .tok"))
      .map(s => getComputedStyle(s).backgroundColor),
  })));
  same(turns.map(t => t.turn), expected.episode.turns.map(t => t.turn), "episode turns");
  let tokens = 0, coloured = 0;
  for (const [k, want] of expected.episode.turns.entries()) {
    const got = turns[k];
    for (const field of ["ids", "texts", "logprobs", "advantages", "mask"]) {
      same(got[field], want[field], `turn ${want.turn} ${field}`);
    }
    same(got.masked_class, want.mask, `turn ${want.turn} greyed (masked) tokens`);
    for (const [i, title] of got.titles.entries()) {
      if (!title.includes(`id ${want.ids[i]}`) || !title.includes("log-prob") ||
          !title.includes("advantage")) {
        fail(`turn ${want.turn} token ${i}: hover text "${title}" lacks id, log-prob or advantage`);
      }
      // Trained tokens: red for a positive advantage, blue for a negative one.
      if (want.mask[i] === 1 && want.advantages[i] !== 0) {
        const [r, , b] = got.colours[i].match(/\d+/g).map(Number);
        if ((want.advantages[i] > 0) !== (r > b)) {
          fail(`turn ${want.turn} token ${i}: advantage ${want.advantages[i]} coloured ${got.colours[i]}`);
        }
        coloured++;
      }
    }
    tokens += want.ids.length;
  }
  console.log(`ok: the episode shows ${turns.length} turns, ${tokens} tokens (${coloured} coloured by advantage)`);

  // The groups of a step.
  await open(expected.step.path);
  const groups = await page.$$eval("table.groups tr[data-group]", rows => rows.map(r => ({
    group_id: Number(r.dataset.group),
    rewards: JSON.parse(r.dataset.rewards),
  })));
  same(groups, expected.step.groups, "groups of the step");
  console.log(`ok: the step shows ${groups.length} groups with their rewards`);

  // A live update: a line appended to metrics.jsonl appears without a reload.
  const live = expected.live;
  await open(`/run?run=${encodeURIComponent(live.run)}`);
  const sel = `svg.curve[data-key="${live.key}"]`;
  await page.waitForSelector(sel, { timeout: 20000 });
  const before = await page.$$eval(`${sel} circle.point`, cs => cs.length);
  fs.appendFileSync(live.metrics, live.line);
  await page.waitForFunction(([sel, n]) =>
    document.querySelectorAll(`${sel} circle.point`).length === n, [sel, before + 1],
    { timeout: 20000 });
  const last = await page.$$eval(`${sel} circle.point`, cs => {
    const c = cs[cs.length - 1];
    return [Number(c.dataset.step), Number(c.dataset.value)];
  });
  same(last, [live.step, live.value], "the appended point");
  console.log(`ok: the live curve ${live.key} went from ${before} to ${before + 1} points`);

  if (errors.length) fail(errors.join("\n"));
} catch (e) {
  console.error(`dashboard check failed: ${e.message}`);
  code = 1;
} finally {
  await context.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
process.exit(code);
