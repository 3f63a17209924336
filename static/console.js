// The console works without this file; it only asks before destructive actions.
document.addEventListener("submit", (event) => {
  const question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
