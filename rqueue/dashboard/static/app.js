// rqueue dashboard: live figures and small conveniences. No framework, no
// network beyond this dashboard. Fragments come from the server's templates,
// which escape every value; they are parsed as an inert document and moved
// in as nodes. Text from data is only ever set with textContent.
"use strict";

(function () {
  const status = document.getElementById("live-status");

  function say(text) {
    if (status) status.textContent = text;
  }

  function clock(date) {
    return date.toTimeString().slice(0, 8);
  }

  function follow(box) {
    const every = Math.max(500, Number(box.dataset.every) || 2000);
    let failures = 0;
    async function tick() {
      if (!document.hidden) {
        try {
          const reply = await fetch(box.dataset.live, {
            credentials: "same-origin",
            headers: { Accept: "text/html" },
          });
          if (reply.ok) {
            const doc = new DOMParser().parseFromString(await reply.text(), "text/html");
            const nodes = Array.from(doc.body.childNodes, (n) => document.adoptNode(n));
            keepOpen(box, nodes);
            box.replaceChildren(...nodes);
            applyFilter();
            failures = 0;
            say("live · updated " + clock(new Date()));
          } else {
            failures += 1;
            say("update failed: HTTP " + reply.status + " (retrying)");
          }
        } catch (err) {
          failures += 1;
          say("update failed: " + String(err && err.message ? err.message : err) + " (retrying)");
        }
      }
      setTimeout(tick, every * Math.min(8, 1 + failures));
    }
    setTimeout(tick, every);
  }

  // Partition tables the user opened stay open across refreshes.
  function keepOpen(box, nodes) {
    const open = new Set();
    box.querySelectorAll("tr[data-queue] details[open]").forEach((d) => {
      open.add(d.closest("tr").dataset.queue);
    });
    if (!open.size) return;
    nodes.forEach((n) => {
      if (n.querySelectorAll) {
        n.querySelectorAll("tr[data-queue] details").forEach((d) => {
          if (open.has(d.closest("tr").dataset.queue)) d.open = true;
        });
      }
    });
  }

  // The overview's name filter: hides rows, compares the names as text.
  const filter = document.getElementById("queue-filter");
  function applyFilter() {
    if (!filter) return;
    const wanted = filter.value.trim().toLowerCase();
    document.querySelectorAll("tr[data-queue]").forEach((row) => {
      row.hidden = wanted !== "" && !row.dataset.queue.toLowerCase().includes(wanted);
    });
  }
  if (filter) filter.addEventListener("input", applyFilter);

  document.querySelectorAll("[data-live]").forEach(follow);

  const all = document.getElementById("pick-all");
  if (all) {
    all.addEventListener("change", () => {
      document.querySelectorAll("input.pick").forEach((box) => {
        box.checked = all.checked;
      });
    });
  }
})();
