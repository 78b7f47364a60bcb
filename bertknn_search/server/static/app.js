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

// A bar's length is the probability relative to the column's top answer: on a flat distribution every
// probability is a few percent at most, and bars of 100 * p would all look alike (issue 35).
function barWidth(prob, top) {
  return top > 0 ? Math.max(0.5, (100 * prob) / top) : 0.5;
}

function drawRanking(box, predictions) {
  const list = box.querySelector("ol");
  list.replaceChildren();
  if (predictions === null) {
    list.append(el("li", "none", "n/a: the model has no masked-LM head"));
    return;
  }
  const shown = predictions.slice(0, 10);
  const top = Math.max(0, ...shown.map((pred) => pred.prob));
  shown.forEach((pred, i) => {
    const item = el("li");
    const word = el("button", "word", pred.word);
    word.type = "button";
    word.dataset.word = pred.word;
    word.setAttribute("aria-pressed", String(pred.word === chosen));
    word.addEventListener("click", () => showEvidenceFor(pred.word));
    // A word of several wordpieces (a whole-word index) shows them: it is one answer, not a guess of pieces.
    if (pred.pieces && pred.pieces.length) word.title = pred.pieces.join(" ");
    item.append(el("span", "rank", String(i + 1)), word);
    const bar = el("span", "bar");
    const fill = el("span", "fill");
    fill.style.width = barWidth(pred.prob, top).toFixed(1) + "%";
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

function sentenceList(sentences) {
  const list = el("ul");
  for (const s of sentences) {
    const item = el("li", "sentence");
    // The span [start, end) is the answer's word inside the stored sentence, in code points.
    const [before, word, after] = splitSpan(s.sentence, s.start, s.end);
    item.append(before, el("mark", "", word), after);
    item.append(el("span", "source", ` — ${s.title}, d² ${s.distance.toFixed(2)}`));
    list.append(item);
  }
  return list;
}

function drawEvidence(answer) {
  const box = $("evidence");
  box.replaceChildren();
  if (!answer.evidence.length) box.append(el("p", "none", "No stored sentence voted for the top answers."));
  for (const ev of answer.evidence) {
    const group = el("div", "evidence-group");
    group.append(el("h4", "", ev.word), sentenceList(ev.sentences));
    box.append(group);
  }
}

// -- evidence for a clicked word ------------------------------------------------------------------
let chosen = null; // the word whose sentences are shown, or null
let current = { body: null, answer: null }; // the question on screen, as asked, and its latest answer

// What the answer already says about ``word``: its evidence_for entry, or a top answer's evidence.
function knownEvidence(answer, word) {
  const asked = (answer.evidence_for || []).find((e) => e.word === word);
  if (asked) return asked;
  const top = (answer.evidence || []).find((e) => e.word === word);
  return top ? { word, sentences: top.sentences, votes: null, answerable: true } : null;
}

function drawChosen(answer) {
  const box = $("chosen-evidence");
  box.hidden = chosen === null;
  if (chosen === null) return;
  const known = answer ? knownEvidence(answer, chosen) : null;
  const head = el("h4", "", `Sentences that voted for “${chosen}”`);
  box.replaceChildren(head);
  if (known === null) {
    box.append(el("p", "hint", current.body ? "Looking for them…" : "Not known for this answer."));
  } else if (!known.answerable) {
    const why = `None: it cannot be an answer on this index (an answer is ${answerKind}).`;
    box.append(el("p", "hint", why));
  } else if (!known.sentences.length) {
    box.append(el("p", "hint", `None: no neighbour of the ${answer.n_neighbors} holds it.`));
  } else {
    if (known.votes !== null) head.textContent += ` (${known.votes} of the ${answer.n_neighbors} neighbours)`;
    box.append(sentenceList(known.sentences));
  }
}

// The sentences behind any word of the three columns: from the answer when it has them, else asked for.
async function showEvidenceFor(word) {
  chosen = word;
  for (const button of document.querySelectorAll(".ranking button.word")) {
    button.setAttribute("aria-pressed", String(button.dataset.word === word));
  }
  drawChosen(current.answer);
  if (!current.body || (current.answer && knownEvidence(current.answer, word))) return;
  const mine = asking;
  try {
    const [reply, data] = await post(withChosen(current.body));
    if (mine !== asking || chosen !== word) return;
    if (!reply.ok) {
      setStatus(data.detail || `The server answered ${reply.status}.`, true);
      return;
    }
    draw(data.answers[0]);
  } catch (err) {
    setStatus(`Cannot reach the server: ${err.message}`, true);
  }
}

function withChosen(body) {
  return chosen === null ? body : { ...body, evidence_for: [chosen] };
}

function drawCoverage(answer, updating) {
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
      (updating
        ? ". Encoding more: the answer is updated as they come."
        : ". Ask again to encode more.")
    : "";
}

// -- confidence -----------------------------------------------------------------------------------
// What each band means, in short; the measurements are in docs/evaluation.md (Confidence).
const CONFIDENCE = {
  high: "high: about half of such answers were right on relations the fit never saw",
  medium: "medium: about one in five such answers was right",
  low: "low: such answers were right rarely; weigh the other answers and the evidence",
};

function drawConfidence(answer) {
  // Absent from an older server's answers: then there is nothing to show.
  const badge = $("confidence");
  const c = answer.confidence;
  badge.hidden = !c || !CONFIDENCE[c.level];
  if (badge.hidden) return;
  badge.className = `confidence ${c.level}`;
  badge.textContent = `${c.level} confidence`;
  // p: the estimated probability that the answer is right; votes of its neighbours.
  const p = typeof c.p === "number" ? ` (p ${c.p.toFixed(2)}` : "";
  const alone = c.votes === 0 ? ": BERT's answer alone" : "";
  const votes = p && c.neighbours ? `; ${c.votes} of ${c.neighbours} neighbours${alone})` : p ? ")" : "";
  const score = p + votes;
  badge.title = CONFIDENCE[c.level] + score + " (docs/evaluation.md, Confidence)";
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

function draw(answer, updating = false) {
  current.answer = answer;
  $("asked").textContent = answer.question + (answer.subject ? `  (subject: ${answer.subject})` : "");
  drawArticles(answer);
  drawCoverage(answer, updating);
  drawSplitWords(answer);
  drawConfidence(answer);
  for (const box of document.querySelectorAll(".ranking")) drawRanking(box, answer[box.dataset.model]);
  drawChosen(answer);
  drawEvidence(answer);
  $("result").hidden = false;
}

// Asking again encodes more of a partly encoded article, until it is whole or stops growing; a newer
// question stops the updates. The footer's counts are read again meanwhile, so that both move.
const UPDATE_MS = 500;
const MAX_UPDATES = 2000;
const MAX_STALLED = 5; // rounds in a row that encoded nothing: another client's work, or a stuck server
const STATS_MS = 1000;
let asking = 0;

function encoded(answer) {
  return Object.values(answer.coverage || {}).reduce((sum, c) => sum + c.encoded, 0);
}

async function post(body) {
  const reply = await fetch("/query", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  return [reply, await reply.json()];
}

async function update(body, mine, round, stalled) {
  if (mine !== asking) return;
  const before = encoded(current.answer);
  let next = null;
  try {
    const [reply, data] = await post(withChosen(body));
    if (mine !== asking) return;
    if (reply.ok) {
      const answer = data.answers[0];
      const grew = encoded(answer) > before;
      const more = answer.partial && round + 1 < MAX_UPDATES && (grew || stalled + 1 < MAX_STALLED);
      draw(answer, more);
      if (more) next = () => update(body, mine, round + 1, grew ? 0 : stalled + 1);
    }
  } catch (err) {
    // The partial answer on screen stays; the next question starts afresh.
  }
  if (next) {
    setTimeout(next, UPDATE_MS);
  } else if (mine === asking && current.answer) {
    drawCoverage(current.answer, false);
    watching = null;
    showIndex();
  }
}

// While a question is being answered or completed, the footer's counts are read every STATS_MS.
let watching = null;

function watchIndex(mine) {
  watching = mine;
  const tick = async () => {
    if (watching !== mine) return;
    await showIndex();
    if (watching === mine) setTimeout(tick, STATS_MS);
  };
  setTimeout(tick, STATS_MS);
}

// The address of the question on screen, so that it can be linked to (and reloaded).
function linkTo(question, subject) {
  const params = new URLSearchParams({ question });
  if (subject) params.set("subject", subject);
  history.replaceState(null, "", `${location.pathname}?${params}`);
}

// What is wrong with a question's [MASK], as the CLI says it (bertknn_search/textcheck.py): another
// model's mask or [mask] in lower case gets "did you mean [MASK]?"; null when it has exactly one.
function maskProblem(question) {
  const count = question.split("[MASK]").length - 1;
  if (count === 0) {
    const lower = /\[mask\]/i.exec(question);
    if (lower) return `The question has '${lower[0]}': did you mean [MASK] (upper case)?`;
    const other = /<mask>|\{mask\}|\[blank\]|_{3,}/i.exec(question);
    if (other) return `The question has '${other[0]}': did you mean [MASK] (BERT's mask)?`;
  }
  return count === 1 ? null : `The question needs exactly one [MASK]; it has ${count}.`;
}

// The model as a short name: a hub name as it is, a local folder by its last two parts
// (".../sentence-transformers/all-MiniLM-L6-v2"), so that a folder named "model" still says whose.
function modelLabel(model) {
  const name = String(model || "");
  const isPath = /^[./~]/.test(name) || name.includes("\\") || name.split("/").length > 2;
  return isPath ? name.split(/[\\/]+/).filter(Boolean).slice(-2).join("/") : name;
}

async function ask(event, retries = 0) {
  if (event) event.preventDefault();
  const question = $("question").value.trim();
  const subject = $("subject").value.trim();
  const problem = maskProblem(question);
  if (problem) {
    setStatus(problem, true);
    return;
  }
  const body = { question };
  if (subject) body.subject = subject;
  linkTo(question, subject);
  $("ask").disabled = true;
  setStatus("Asking…", false);
  const mine = ++asking;
  chosen = null;
  current = { body, answer: null };
  watchIndex(mine);
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
      watching = null;
      return;
    }
    const partial = data.answers[0].partial;
    draw(data.answers[0], partial);
    setStatus("", false);
    if (partial) {
      setTimeout(() => update(body, mine, 0, 0), UPDATE_MS);
    } else {
      watching = null;
      showIndex();
    }
  } catch (err) {
    setStatus(`Cannot reach the server: ${err.message}`, true);
    watching = null;
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

// A question holds exactly one [MASK]: one already there moves to the cursor rather than being doubled.
function withOneMask(text, at, end) {
  const MASK = "[MASK]";
  const only = text.indexOf(MASK);
  if (only !== -1 && text.indexOf(MASK, only + 1) === -1 && at >= only && end <= only + MASK.length) {
    return [text, only + MASK.length]; // the cursor is on the [MASK] already there: nothing to move
  }
  for (let i = text.indexOf(MASK); i !== -1; i = text.indexOf(MASK)) {
    // A space next to the removed [MASK] goes with it: the one before when a space, a stop or the end
    // follows, the one after at the start.
    const after = text[i + MASK.length] ?? "";
    const from = text[i - 1] === " " && /^[\s.,;:!?)]?$/.test(after) ? i - 1 : i;
    const to = i + MASK.length + (i === 0 && after === " " ? 1 : 0);
    const moved = (pos) => (pos <= from ? pos : pos >= to ? pos - (to - from) : from);
    [at, end] = [moved(at), moved(end)];
    text = text.slice(0, from) + text.slice(to);
  }
  return [text.slice(0, at) + MASK + text.slice(end), at + MASK.length];
}

function insertMask() {
  const input = $("question");
  const at = input.selectionStart ?? input.value.length;
  const end = input.selectionEnd ?? at;
  const [text, cursor] = withOneMask(input.value, at, end);
  input.value = text;
  input.focus();
  input.setSelectionRange(cursor, cursor);
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

// What an answer is on this index, by its mask policy (the help line and the evidence notes say it).
let answerKind = "one word";

function answerKindOf(policy) {
  return (policy || "").startsWith("whole-word")
    ? "a whole word, even one the vocabulary splits into several wordpieces"
    : "one word of the model's vocabulary (a single wordpiece)";
}

async function showIndex(first = false) {
  try {
    if (first) {
      const health = await (await fetch("/health")).json();
      if (health.status !== "ready") setStatus(health.detail, health.status === "failed");
    }
    const stats = await (await fetch("/stats")).json();
    const model = modelLabel(stats.meta.model);
    answerKind = answerKindOf(stats.meta.mask_policy);
    $("answer-kind").textContent = `The answer is ${answerKind}.`;
    $("index-info").textContent =
      `${contextsLine(stats)} · model ${model}, layer ${stats.meta.layer} · API docs at /docs`;
  } catch (err) {
    $("index-info").textContent = "Index information is not available.";
  }
}

$("ask-form").addEventListener("submit", (event) => ask(event));
$("insert-mask").addEventListener("click", insertMask);
showIndex(true);
askFromAddress();
