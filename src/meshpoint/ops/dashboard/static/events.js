// The live events page: every second, ask for the events from a little before the
// newest shown (an event commits up to its writer's flush interval after its time,
// behind later ones) and add those not shown yet. Plain JavaScript, no build step.
(function () {
  "use strict";
  var LOOKBACK_US = 5000000;
  var table = document.getElementById("events");
  var body = table.tBodies[0];
  var state = document.getElementById("live-state");
  var shown = {};
  var newest = Date.now() * 1000 - LOOKBACK_US;
  Array.prototype.forEach.call(body.rows, function (row) {
    shown[row.dataset.id] = true;
    newest = Math.max(newest, Number(row.dataset.us));
  });

  function cell(row, text, href) {
    var td = row.insertCell();
    if (href) {
      var a = document.createElement("a");
      a.href = href;
      a.textContent = text;
      td.appendChild(a);
    } else {
      td.textContent = text;  // text, never markup: what a requester wrote stays text
    }
  }

  function add(e) {
    if (shown[e.id]) { return; }
    shown[e.id] = true;
    newest = Math.max(newest, e.us);
    var row = body.insertRow();
    row.dataset.id = e.id;
    row.dataset.us = e.us;
    row.className = "new";
    cell(row, e.at);
    cell(row, e.agent);
    cell(row, e.task, e.task ? "/tasks/" + encodeURIComponent(e.task) : null);
    cell(row, e.type);
    cell(row, e.step);
    cell(row, e.output);
  }

  function poll() {
    var query = new URLSearchParams({since_us: String(newest - LOOKBACK_US)});
    if (table.dataset.task) { query.set("task", table.dataset.task); }
    if (table.dataset.agent) { query.set("agent", table.dataset.agent); }
    fetch("/events/feed?" + query.toString(), {credentials: "same-origin"})
      .then(function (r) { return r.json(); })
      .then(function (data) {
        data.events.forEach(add);
        state.textContent = "live";
      })
      .catch(function () { state.textContent = "reconnecting"; })
      .finally(function () { setTimeout(poll, 1000); });
  }
  setTimeout(poll, 1000);
}());
