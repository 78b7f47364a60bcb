// The page's only script: asks POST /query and draws the answer. Text goes in with textContent only,
// so nothing from the index or the question is ever parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setStatus(text, isError) {
  const status = $("status");
  status.textContent = text;
  status.className = isError ? "error" : "";
}

function percent(p) {
  return p >= 0.0995 ? (100 * p).toFixed(0) + "%" : (100 * p).toFixed(1) + "%";
}

function drawRanking(box, predictions) {
  const list = box.querySelector("ol");
  list.replaceChildren();
  if (predictions === null) {
    list.append(el("li", "none", "n/a: the model has no masked-LM head"));
    return;
  }
  predictions.slice(0, 10).forEach((pred, i) => {
    const item = el("li");
    const word = el("span", "word", pred.word);
    // A word of several wordpieces (a whole-word index) shows them: it is one answer, not a guess of pieces.
    if (pred.pieces && pred.pieces.length) word.title = pred.pieces.join(" ");
    item.append(el("span", "rank", String(i + 1)), word);
    const bar = el("span", "bar");
    const fill = el("span", "fill");
    fill.style.width = Math.max(0.5, 100 * pred.prob).toFixed(1) + "%";
    bar.append(fill);
    item.append(bar, el("span", "prob", percent(pred.prob)));
    list.append(item);
  });
  if (!predictions.length) list.append(el("li", "none", "no neighbours: kNN has no vote"));
}

function drawArticles(answer) {
  const box = $("articles");
  box.replaceChildren(el("strong", "", "Articles searched: "));
  if (!answer.articles.length) {
    // Without a masked-LM head there is no BERT to fall back to: the CLI says the same.
    const fallback = answer.bert === null ? "no answer without BERT" : "BERT-kNN falls back to BERT";
    box.append(answer.n_neighbors ? "every context (no IR)" : `none found; ${fallback}`);
    return;
  }
  answer.articles.forEach((a, i) => {
    if (i) box.append(", ");
    box.append(el("span", "article", a.title));
    box.append(el("span", "score", a.score === null ? " (own article)" : ` (${a.score.toFixed(2)})`));
  });
  box.append(el("span", "score", ` · ${answer.n_neighbors} neighbours`));
}

// The API's spans count code points (as Python indexes strings); a JavaScript string counts UTF-16
// units, in which an emoji or any character past U+FFFF is two. Array.from splits by code points.
function splitSpan(text, start, end) {
  const points = Array.from(text);
  return [points.slice(0, start), points.slice(start, end), points.slice(end)].map((p) => p.join(""));
}

function drawEvidence(answer) {
  const box = $("evidence");
  box.replaceChildren();
  if (!answer.evidence.length) box.append(el("p", "none", "No stored sentence voted for the top answers."));
  for (const ev of answer.evidence) {
    const group = el("div", "evidence-group");
    group.append(el("h4", "", ev.word));
    const list = el("ul");
    for (const s of ev.sentences) {
      const item = el("li", "sentence");
      // The span [start, end) is the answer's word inside the stored sentence, in code points.
      const [before, word, after] = splitSpan(s.sentence, s.start, s.end);
      item.append(before, el("mark", "", word), after);
      item.append(el("span", "source", ` — ${s.title}, d² ${s.distance.toFixed(2)}`));
      list.append(item);
    }
    group.append(list);
    box.append(group);
  }
}

function drawCoverage(answer) {
  // A lazy index answers a cold question over the contexts most like it first, and says how many.
  const box = $("coverage");
  const titles = Object.fromEntries(answer.articles.map((a) => [a.id, a.title]));
  const partial = Object.entries(answer.coverage || {}).filter(([, c]) => c.encoded < c.total);
  box.hidden = !partial.length;
  box.textContent = partial.length
    ? "Partial answer: contexts encoded so far of " +
      partial
        .map(([id, c]) => `${titles[id] || id} ${c.encoded.toLocaleString()} of ${c.total.toLocaleString()}`)
        .join(", ") +
      ". The answer is updated as more are encoded."
    : "";
}

function drawSplitWords(answer) {
  // The word the question seems to ask for, where the vocabulary splits it: no ranking can hold it.
  const box = $("split-words");
  const words = answer.split_words || [];
  box.hidden = !words.length;
  const listed = words.map((w) => `“${w.word}” (${w.pieces.join(" ")}, in ${w.title})`).join(", ");
  box.textContent = !words.length
    ? ""
    : `Note: ${listed} ${words.length === 1 ? "stands" : "stand"} where the question has [MASK], but ` +
      "an answer is one wordpiece of the model's vocabulary, so " +
      (words.length === 1 ? "it cannot be one." : "none of them can be.");
}

function draw(answer) {
  $("asked").textContent = answer.question + (answer.subject ? `  (subject: ${answer.subject})` : "");
  drawArticles(answer);
  drawCoverage(answer);
  drawSplitWords(answer);
  for (const box of document.querySelectorAll(".ranking")) drawRanking(box, answer[box.dataset.model]);
  drawEvidence(answer);
  $("result").hidden = false;
}

// Asking again encodes more of a partly encoded article; a newer question stops the updates.
const MAX_UPDATES = 30;
let asking = 0;

async function post(body) {
  const reply = await fetch("/query", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  return [reply, await reply.json()];
}

async function update(body, mine, round) {
  if (mine !== asking || round >= MAX_UPDATES) return;
  try {
    const [reply, data] = await post(body);
    if (mine !== asking || !reply.ok) return;
    draw(data.answers[0]);
    if (data.answers[0].partial) setTimeout(() => update(body, mine, round + 1), 500);
  } catch (err) {
    // The partial answer on screen stays; the next question starts afresh.
  }
}

// The address of the question on screen, so that it can be linked to (and reloaded).
function linkTo(question, subject) {
  const params = new URLSearchParams({ question });
  if (subject) params.set("subject", subject);
  history.replaceState(null, "", `${location.pathname}?${params}`);
}

async function ask(event, retries = 0) {
  if (event) event.preventDefault();
  const question = $("question").value.trim();
  const subject = $("subject").value.trim();
  const count = question.split("[MASK]").length - 1;
  if (count !== 1) {
    setStatus(`The question needs exactly one [MASK]; it has ${count}.`, true);
    return;
  }
  const body = { question };
  if (subject) body.subject = subject;
  linkTo(question, subject);
  $("ask").disabled = true;
  setStatus("Asking…", false);
  const mine = ++asking;
  try {
    const [reply, data] = await post(body);
    if (reply.status === 503 && retries > 0 && mine === asking) {
      // A linked question arrives while the model is still loading: ask again once it can answer.
      setStatus(data.detail || "The server is not ready yet.", false);
      setTimeout(() => ask(null, retries - 1), 1000);
      return;
    }
    if (!reply.ok) {
      setStatus(data.detail || `The server answered ${reply.status}.`, true);
      return;
    }
    draw(data.answers[0]);
    setStatus("", false);
    if (data.answers[0].partial) setTimeout(() => update(body, mine, 0), 500);
  } catch (err) {
    setStatus(`Cannot reach the server: ${err.message}`, true);
  } finally {
    $("ask").disabled = false;
  }
}

// /?question=...&subject=... fills the form and asks it, as a link from elsewhere or a reload would.
function askFromAddress() {
  // Never inside a frame: the server's headers (frame-ancestors 'none', X-Frame-Options) already keep a
  // browser from drawing the page in one; this covers a browser that ignores both.
  if (window.top !== window.self) return;
  const params = new URLSearchParams(location.search);
  const question = params.get("question");
  if (!question) return;
  $("question").value = question;
  $("subject").value = params.get("subject") || "";
  ask(null, 180);
}

function insertMask() {
  const input = $("question");
  const at = input.selectionStart ?? input.value.length;
  const end = input.selectionEnd ?? at;
  input.value = input.value.slice(0, at) + "[MASK]" + input.value.slice(end);
  input.focus();
  input.setSelectionRange(at + 6, at + 6);
}

function contextsLine(stats) {
  const n = (x) => x.toLocaleString();
  const articles = `${n(stats.articles)} ${stats.articles === 1 ? "article" : "articles"}`;
  if (stats.meta.contexts !== "lazy") return `${articles} · ${n(stats.contexts)} contexts`;
  // A lazy index encodes an article's contexts when a question first needs it: say how far it has got.
  const encoded = `${n(stats.encoded_articles)} encoded`;
  if (stats.estimated_contexts === null) {
    return (
      `${articles} (${encoded}) · lazy index: ${n(stats.contexts)} contexts encoded ` +
      "(the total is estimated once an article is encoded)"
    );
  }
  return (
    `${articles} (${encoded}) · lazy index: ${n(stats.contexts)} of ~${n(stats.estimated_contexts)} ` +
    "contexts encoded (the total is an estimate)"
  );
}

async function showIndex() {
  try {
    const health = await (await fetch("/health")).json();
    if (health.status !== "ready") setStatus(health.detail, health.status === "failed");
    const stats = await (await fetch("/stats")).json();
    const model = stats.meta.model.split("/").pop();
    $("index-info").textContent =
      `${contextsLine(stats)} · model ${model}, layer ${stats.meta.layer} · API docs at /docs`;
  } catch (err) {
    $("index-info").textContent = "Index information is not available.";
  }
}

$("ask-form").addEventListener("submit", (event) => ask(event));
$("insert-mask").addEventListener("click", insertMask);
showIndex();
askFromAddress();
