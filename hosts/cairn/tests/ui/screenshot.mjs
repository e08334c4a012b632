// Takes the docs' screenshots of a running dashboard (not part of the test):
//
//   target/debug/cairn ui RUN_DIR --port 0        # prints the URL
//   node hosts/cairn/tests/ui/screenshot.mjs URL docs/dashboard.png [PATH ...]
//
// Each PATH (default: the page URL itself) is opened in headless Chromium at 1280 px wide and
// shot in full; the first goes to OUT, the next ones to OUT with -2, -3, ... before ".png".
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const [url, out, ...paths] = process.argv.slice(2);
if (!url || !out) {
  console.error("usage: node screenshot.mjs URL OUT.png [PATH ...]");
  process.exit(2);
}
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "cairn-ui-shot-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1280, height: 800 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await context.newPage();
  const targets = paths.length ? paths : [""];
  for (const [i, p] of targets.entries()) {
    await page.goto(url.replace(/\/$/, "") + p);
    // The curves are drawn by the script after its first poll.
    if (await page.$("#curves")) await page.waitForSelector("svg.curve", { timeout: 20000 });
    const file = i === 0 ? out : out.replace(/\.png$/, `-${i + 1}.png`);
    await page.screenshot({ path: file, fullPage: true });
    console.log(file);
  }
} finally {
  await context.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
