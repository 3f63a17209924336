// The console works without this file; it only asks before destructive actions. The
// question is the button's, else the form's; `{n}` in it is how many rows are ticked for
// that form.
document.addEventListener("submit", (event) => {
  const question = (event.submitter && event.submitter.getAttribute("data-confirm")) || event.target.getAttribute("data-confirm");
  if (!question) return;
  // getAttribute: the form's `id` property is its controls named "id" (the row boxes).
  const ticked = document.querySelectorAll(`input[name=id][form="${event.target.getAttribute("id")}"]:checked`).length;
  if (question.includes("{n}") && ticked === 0) return; // the server says nothing was selected
  if (!window.confirm(question.replace("{n}", ticked))) {
    event.preventDefault();
  }
});

// The task list's "select every row on this page" box, shown only with this script.
const selectAll = document.getElementById("select-all");
if (selectAll) {
  const boxes = () => [...document.querySelectorAll('input[name=id][form="selected"]')];
  selectAll.hidden = false;
  selectAll.addEventListener("change", () => boxes().forEach((box) => (box.checked = selectAll.checked)));
  document.addEventListener("change", (event) => {
    if (event.target.getAttribute("form") !== "selected") return;
    const ticked = boxes().filter((box) => box.checked).length;
    selectAll.checked = ticked > 0 && ticked === boxes().length;
    selectAll.indeterminate = ticked > 0 && ticked < boxes().length;
  });
}

// The task page's reschedule form: offer the browser's own zone (the server reads times in
// the zone the form names; without this script the form stays in the zone it shows). Run
// again on each part a refresh swaps in.
function offerBrowserZone(root) {
  for (const button of root.querySelectorAll("[data-browser-zone-button]")) {
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    const current = root.querySelector("[data-browser-zone]");
    if (zone && current && current.value !== zone) {
      button.form.querySelector("[data-browser-zone-value]").value = zone;
      button.textContent = `Show the time in my zone (${zone})`;
      button.hidden = false;
    }
  }
}
offerBrowserZone(document);

// A form in the live part that a person is filling in: a refresh would throw it away. Each
// field is compared with what it held when the part was shown (not its defaultValue: the
// browser rewrites some, "09:30:00" reading "09:30", and a script fills hidden ones).
const fields = (root) => [...root.querySelectorAll("input:not([type=hidden]), select, textarea")];
const state = (field) => (field.type === "checkbox" || field.type === "radio" ? field.checked : field.value);
const shown = new WeakMap();
function remember(root) {
  for (const field of fields(root)) shown.set(field, state(field));
}
function beingFilled(live) {
  const focused = document.activeElement;
  if (focused && live.contains(focused) && focused.form && focused.matches("input, select, textarea")) return true;
  return fields(live).some((field) => shown.has(field) && shown.get(field) !== state(field));
}

// Pages that change by themselves (the dashboard, the cluster, a task not yet finished):
// every few seconds, while the box is ticked (remembered in this browser, for each kind of
// page), the page is fetched again and its live part swapped in, unless a form in it is
// being filled in. A page fetched without the box has stopped changing (its task finished):
// the refresh stops there. Without this script the box stays hidden and the page is read as
// served (reload it to update).
const refresh = document.getElementById("auto-refresh");
if (refresh) {
  const key = `chime.${refresh.dataset.refreshKey || "dashboard"}.refresh`;
  const seconds = Number(refresh.dataset.refreshSeconds) || 10;
  const said = document.getElementById("refreshed");
  refresh.checked = localStorage.getItem(key) !== "off";
  document.getElementById("refresh").hidden = false;
  refresh.addEventListener("change", () => localStorage.setItem(key, refresh.checked ? "on" : "off"));
  remember(document.getElementById("live"));
  const every = setInterval(async () => {
    const live = document.getElementById("live");
    if (!refresh.checked || document.hidden || beingFilled(live)) return;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (response.redirected || !response.ok) {
        // Signed out (or the server is unwell): show the page the server gives.
        window.location.reload();
        return;
      }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("live");
      if (fresh) {
        live.replaceWith(fresh);
        offerBrowserZone(fresh);
        remember(fresh);
        said.textContent = `updated ${new Date().toLocaleTimeString()}`;
      }
      if (!page.getElementById("auto-refresh")) {
        clearInterval(every);
        refresh.disabled = true;
        said.textContent = `updated ${new Date().toLocaleTimeString()}; finished, so no longer refreshed`;
      }
    } catch (e) {
      said.textContent = `not updated (${e.message}); trying again in ${seconds} s`;
    }
  }, seconds * 1000);
}

// Copy buttons beside a secret shown once. Without this script they stay hidden, and a
// click selects the whole secret (user-select: all) for copying by hand.
for (const button of document.querySelectorAll("button[data-copy]")) {
  const source = document.getElementById(button.dataset.copy);
  if (!source) continue;
  const said = button.parentElement.querySelector("[role=status]");
  button.hidden = false;
  button.addEventListener("click", async () => {
    const text = source.textContent.trim();
    try {
      if (navigator.clipboard && window.isSecureContext) {
        await navigator.clipboard.writeText(text);
      } else {
        // Plain HTTP, not localhost: the Clipboard API is not offered; the older way is.
        const range = document.createRange();
        range.selectNodeContents(source);
        window.getSelection().removeAllRanges();
        window.getSelection().addRange(range);
        if (!document.execCommand("copy")) throw new Error("the browser would not copy");
      }
      if (said) said.textContent = "Copied.";
    } catch (e) {
      if (said) said.textContent = `Not copied (${e.message}): select it and copy it by hand.`;
    }
  });
}

// A bulk operation's page follows its tasks: every few seconds, while its live part asks
// to (data-follow-seconds), the page is fetched again and that part swapped in; the server
// stops asking once every task is settled. Without this script, reload the page to update.
const followed = document.getElementById("operation-live");
if (followed && followed.dataset.followSeconds) {
  const seconds = Number(followed.dataset.followSeconds) || 2;
  const timer = setInterval(async () => {
    if (document.hidden) return;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (response.redirected || !response.ok) {
        clearInterval(timer);
        window.location.reload();
        return;
      }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("operation-live");
      if (fresh) {
        document.getElementById("operation-live").replaceWith(fresh);
        if (!fresh.dataset.followSeconds) clearInterval(timer);
      }
    } catch (e) {
      // The next turn tries again; the page says what it last knew.
    }
  }, seconds * 1000);
}
