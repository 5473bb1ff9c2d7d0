// Sortable and filterable tables of the dashboard: a <table class="sortable"> sorts by the column whose
// header is clicked (numbers as numbers: "1.2 ms", "3x" and "-" too; a second click reverses), and an
// <input class="filter" data-table="ID"> shows only the rows of table ID whose text holds every word
// typed (case-insensitive). Plain DOM, no library.
(function () {
  "use strict";
  function key(cell) {
    var text = (cell ? cell.textContent : "").trim();
    var number = parseFloat(text.replace(/,/g, ""));
    return isNaN(number) ? { text: text.toLowerCase() } : { number: number };
  }
  function compare(a, b) {
    if ("number" in a && "number" in b) return a.number - b.number;
    if ("number" in a) return -1;
    if ("number" in b) return 1;
    return a.text < b.text ? -1 : a.text > b.text ? 1 : 0;
  }
  function sortable(table) {
    var headers = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(headers, function (th, column) {
      th.classList.add("sortable");
      th.addEventListener("click", function () {
        var ascending = !th.classList.contains("sorted-ascending");
        Array.prototype.forEach.call(headers, function (h) {
          h.classList.remove("sorted-ascending", "sorted-descending");
        });
        th.classList.add(ascending ? "sorted-ascending" : "sorted-descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (r, s) {
          var order = compare(key(r.cells[column]), key(s.cells[column]));
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  }
  function filter(input) {
    var table = document.getElementById(input.getAttribute("data-table"));
    if (!table) return;
    input.addEventListener("input", function () {
      var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      var shown = 0;
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        var text = row.textContent.toLowerCase();
        var keep = words.every(function (w) { return text.indexOf(w) >= 0; });
        row.style.display = keep ? "" : "none";
        if (keep) shown += 1;
      });
      table.setAttribute("data-shown", String(shown));
    });
  }
  document.querySelectorAll("table.sortable").forEach(sortable);
  document.querySelectorAll("input.filter[data-table]").forEach(filter);
})();
