// The console works without this file; it only asks before destructive actions.
document.addEventListener("submit", (event) => {
  const question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// The task page's reschedule form: offer the browser's own zone (the server reads times in
// the zone the form names; without this script the form stays in the zone it shows).
for (const button of document.querySelectorAll("[data-browser-zone-button]")) {
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  const current = document.querySelector("[data-browser-zone]");
  if (zone && current && current.value !== zone) {
    button.form.querySelector("[data-browser-zone-value]").value = zone;
    button.textContent = `Show the time in my zone (${zone})`;
    button.hidden = false;
  }
}
