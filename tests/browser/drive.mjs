// Drives Debian's Chromium (headless, through playwright-core) against the adapter's WebSocket
// listener, for tests/browser/test_browser.py.  Usage:
//
//   node drive.mjs stompjs <ws-url> <queue> <topic>   @stomp/stompjs in a page: queue, topic,
//                                                     client ack, temp-queue reply-to, heart-beats,
//                                                     then reconnect after the adapter restarts
//   node drive.mjs console <http-url> <topic> <png>   the adapter's web console, by clicks
//   node drive.mjs token <ws-url> <queue> <token> <next-token>
//                                                     @stomp/stompjs logging in with an OAuth 2.0
//                                                     token from the handshake (a Sec-WebSocket-
//                                                     Protocol entry), then refreshing it
//
// Each line on stdout is one JSON object {"event": ..., ...}; the Python test reads them and,
// for the restart, writes one line to stdin when the adapter is back.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const emit = (event, data = {}) => console.log(JSON.stringify({ event, ...data }));
const stdin = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => stdin.once("line", resolve));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"],
});
try {
  const page = await browser.newPage();
  page.on("console", (message) => emit("page-console", { text: message.text() }));
  page.on("pageerror", (error) => emit("pageerror", { text: String(error) }));
  const [mode, url, ...rest] = process.argv.slice(2);
  if (mode === "stompjs") await stompjs(page, url, ...rest);
  else if (mode === "console") await webConsole(page, url, ...rest);
  else if (mode === "token") await tokenLogin(page, url, ...rest);
  else throw new Error(`unknown mode ${mode}`);
} catch (error) {
  emit("failed", { text: String(error && error.stack || error) });
  process.exitCode = 1;
} finally {
  await browser.close();
  stdin.close();
}

async function stompjs(page, url, queue, topic) {
  // A page of the adapter's own origin (Chromium's local-network-access checks block a
  // WebSocket to 127.0.0.1 from about:blank), as an application served beside it would be.
  await page.goto(url.replace(/^ws/, "http").replace(/\/ws$/, "/console"));
  await page.addScriptTag({ path: path.join(here, "node_modules/@stomp/stompjs/bundles/stomp.umd.js") });
  // Everything the page sees is collected in window.seen; the test asserts on it.
  const first = await page.evaluate(async ({ url, queue, topic }) => {
    const seen = (window.seen = { connects: [], messages: [], errors: [], closes: [] });
    const client = (window.client = new StompJs.Client({
      brokerURL: url,
      connectHeaders: { login: "guest", passcode: "guest", host: "/" },
      heartbeatIncoming: 300,
      heartbeatOutgoing: 300,
      reconnectDelay: 200,
    }));
    const waitFor = (test, ms = 10000) =>
      new Promise((resolve, reject) => {
        const started = Date.now();
        const check = () => (test() ? resolve() : Date.now() - started > ms ? reject(new Error("timeout")) : setTimeout(check, 20));
        check();
      });
    window.waitFor = waitFor;
    client.onConnect = (frame) => {
      seen.connects.push({ headers: frame.headers, protocol: client.webSocket.protocol });
      // every (re)connect subscribes again, as an application would
      client.subscribe(queue, (m) => seen.messages.push({ via: "queue", body: m.body, headers: m.headers }));
      client.subscribe(topic, (m) => seen.messages.push({ via: "topic", body: m.body, headers: m.headers }));
      client.subscribe(queue + "-acked", (m) => {
        seen.messages.push({ via: "client-ack", body: m.body, headers: m.headers });
        m.ack();
      }, { ack: "client" });
      client.subscribe(queue + "-requests", (m) => {
        // a responder: answer to the reply-to destination the requester gave
        client.publish({ destination: m.headers["reply-to"], body: "answer to " + m.body });
      });
    };
    client.onUnhandledMessage = (m) => seen.messages.push({ via: "temp-queue", body: m.body, headers: m.headers });
    client.onStompError = (frame) => seen.errors.push(frame.headers.message);
    client.onWebSocketClose = (event) => seen.closes.push(event.code);
    client.activate();
    await waitFor(() => seen.connects.length === 1);
    const receipt = (id) => new Promise((resolve) => client.watchForReceipt(id, resolve));
    const subscribed = receipt("subscribed");
    client.publish({ destination: queue + "-requests", body: "warm-up", headers: { receipt: "subscribed", "reply-to": "/temp-queue/warm" } });
    await subscribed;
    client.publish({ destination: queue, body: "to the queue" });
    client.publish({ destination: topic, body: "to the topic" });
    client.publish({ destination: queue + "-acked", body: "please ack" });
    client.publish({ destination: queue + "-requests", body: "question", headers: { "reply-to": "/temp-queue/answers" } });
    await waitFor(() => seen.messages.filter((m) => m.body === "answer to question").length === 1);
    // idle for a while: heart-beats in both directions must keep the connection up
    await new Promise((resolve) => setTimeout(resolve, 1500));
    return JSON.parse(JSON.stringify(seen));
  }, { url, queue, topic });
  emit("first", { seen: first });
  emit("ready-for-restart");
  await nextLine(); // the test has stopped and started the adapter again on the same port
  const second = await page.evaluate(async ({ queue }) => {
    await window.waitFor(() => window.seen.connects.length === 2, 20000);
    window.client.publish({ destination: queue, body: "after the restart" });
    await window.waitFor(() => window.seen.messages.some((m) => m.body === "after the restart"));
    await window.client.deactivate();
    return JSON.parse(JSON.stringify(window.seen));
  }, { queue });
  emit("second", { seen: second });
}

async function webConsole(page, url, topic, screenshot) {
  await page.goto(url);
  await page.fill("#sub-destination", topic);
  await page.fill("#send-destination", topic);
  await page.click("#connect");
  await page.waitForSelector("#status:text('connected')");
  await page.click("#subscribe");
  await page.waitForSelector(`#messages div:text('receipt subscribed to ${topic}')`);
  await page.fill("#send-body", "typed in the console");
  await page.click("#send");
  await page.waitForSelector("#messages div:has-text('typed in the console')");
  await page.screenshot({ path: screenshot, fullPage: true });
  const lines = await page.$$eval("#messages div", (divs) => divs.map((d) => d.textContent));
  emit("console", { lines });
  await page.click("#disconnect");
  await page.waitForSelector("#status:text('disconnected')");
  emit("console-closed", { lines: await page.$$eval("#messages div", (divs) => divs.map((d) => d.textContent)) });
}

async function tokenLogin(page, url, queue, token, nextToken) {
  await page.goto(url.replace(/^ws/, "http").replace(/\/ws$/, "/console"));
  await page.addScriptTag({ path: path.join(here, "node_modules/@stomp/stompjs/bundles/stomp.umd.js") });
  const seen = await page.evaluate(async ({ url, queue, token, nextToken }) => {
    const seen = { connects: [], messages: [], errors: [], receipts: [] };
    const b64url = (text) => btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    // no token in the URL nor in CONNECT: the handshake's Sec-WebSocket-Protocol carries it
    const client = new StompJs.Client({
      webSocketFactory: () => new WebSocket(url, ["v12.stomp", "base64url.bearer.authorization.stomp." + b64url(token)]),
      connectHeaders: { host: "/" },
      reconnectDelay: 0,
    });
    const waitFor = (test, ms = 10000) =>
      new Promise((resolve, reject) => {
        const started = Date.now();
        const check = () => (test() ? resolve() : Date.now() - started > ms ? reject(new Error("timeout")) : setTimeout(check, 20));
        check();
      });
    const receipt = (id) => new Promise((resolve) => client.watchForReceipt(id, () => { seen.receipts.push(id); resolve(); }));
    let subscribed = null;
    client.onConnect = (frame) => {
      seen.connects.push({ user: frame.headers["server"] ? "ok" : "", protocol: client.webSocket.protocol });
      subscribed = receipt("subscribed");
      client.subscribe(queue, (m) => seen.messages.push(m.body), { receipt: "subscribed" });
    };
    client.onStompError = (frame) => seen.errors.push(frame.headers.message + ": " + frame.body);
    client.activate();
    await waitFor(() => seen.connects.length === 1);
    await subscribed;
    client.publish({ destination: queue, body: "before the refresh" });
    await waitFor(() => seen.messages.length === 1);
    const refreshed = receipt("refreshed");
    client.publish({ destination: "/auth/token", body: nextToken, headers: { receipt: "refreshed" } });
    await refreshed;
    client.publish({ destination: queue, body: "after the refresh" });
    await waitFor(() => seen.messages.length === 2);
    await client.deactivate();
    return seen;
  }, { url, queue, token, nextToken });
  emit("token", { seen });
}
