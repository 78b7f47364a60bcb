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
    item.append(el("span", "rank", String(i + 1)), el("span", "word", pred.word));
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
    box.append(answer.n_neighbors ? "every context (no IR)" : "none found; BERT-kNN falls back to BERT");
    return;
  }
  answer.articles.forEach((a, i) => {
    if (i) box.append(", ");
    box.append(el("span", "article", a.title));
    box.append(el("span", "score", a.score === null ? " (own article)" : ` (${a.score.toFixed(2)})`));
  });
  box.append(el("span", "score", ` · ${answer.n_neighbors} neighbours`));
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
      // The span [start, end) is the answer's word inside the stored sentence.
      item.append(s.sentence.slice(0, s.start), el("mark", "", s.sentence.slice(s.start, s.end)));
      item.append(s.sentence.slice(s.end));
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

function draw(answer) {
  $("asked").textContent = answer.question + (answer.subject ? `  (subject: ${answer.subject})` : "");
  drawArticles(answer);
  drawCoverage(answer);
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

async function ask(event) {
  event.preventDefault();
  const question = $("question").value.trim();
  const subject = $("subject").value.trim();
  const count = question.split("[MASK]").length - 1;
  if (count !== 1) {
    setStatus(`The question needs exactly one [MASK]; it has ${count}.`, true);
    return;
  }
  const body = { question };
  if (subject) body.subject = subject;
  $("ask").disabled = true;
  setStatus("Asking…", false);
  const mine = ++asking;
  try {
    const [reply, data] = await post(body);
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

function insertMask() {
  const input = $("question");
  const at = input.selectionStart ?? input.value.length;
  const end = input.selectionEnd ?? at;
  input.value = input.value.slice(0, at) + "[MASK]" + input.value.slice(end);
  input.focus();
  input.setSelectionRange(at + 6, at + 6);
}

async function showIndex() {
  try {
    const health = await (await fetch("/health")).json();
    if (health.status !== "ready") setStatus(health.detail, health.status === "failed");
    const stats = await (await fetch("/stats")).json();
    const model = stats.meta.model.split("/").pop();
    $("index-info").textContent =
      `${stats.articles.toLocaleString()} articles · ${stats.contexts.toLocaleString()} contexts · ` +
      `model ${model}, layer ${stats.meta.layer} · API docs at /docs`;
  } catch (err) {
    $("index-info").textContent = "Index information is not available.";
  }
}

$("ask-form").addEventListener("submit", ask);
$("insert-mask").addEventListener("click", insertMask);
showIndex();
