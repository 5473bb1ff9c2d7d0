// The dashboard's live parts: an element with data-poll="URL" gets what URL answers (HTML rendered and
// escaped by the server) every data-every milliseconds (default 2000) while the page is visible, and
// stops once the answer holds an element marked data-final (a sweep or job that ended). The browser
// revalidates each answer with its ETag, so an unchanged part costs a 304.
(function () {
  "use strict";
  function poll(element) {
    var url = element.getAttribute("data-poll");
    var every = Number(element.getAttribute("data-every")) || 2000;
    function tick() {
      if (document.hidden) {
        window.setTimeout(tick, every);
        return;
      }
      window
        .fetch(url, { credentials: "same-origin", cache: "no-cache" })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.text();
        })
        .then(function (html) {
          element.innerHTML = html;
          element.setAttribute("data-updated", String(Date.now()));
          if (!element.querySelector("[data-final]")) window.setTimeout(tick, every);
        })
        .catch(function () {
          window.setTimeout(tick, every * 2);
        });
    }
    if (!element.querySelector("[data-final]")) window.setTimeout(tick, every);
  }
  document.querySelectorAll("[data-poll]").forEach(poll);
})();
