// Draws the layout that gpumem-trace computed (the JSON in #trace-data): one SVG path per band,
// a byte axis, a time axis that zooms (wheel) and pans (drag), details on hover. Nothing is
// fetched. When done it sets data-bands (the number of band paths) and data-rendered on <body>.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("trace-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const W = 1200, H = 560, L = 90, R = 20, T = 20, B = 40;
  const PW = W - L - R, PH = H - T - B;
  const kx = PW / data.steps, ky = PH / data.y_max;

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function bytes(v) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return i === 0 ? v + " B" : v.toFixed(1) + " " + u[i];
  }
  const y = (v) => (PH - v * ky).toFixed(2);
  const x = (t) => (t * kx).toFixed(2);

  const svg = el("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H });
  document.getElementById("plot").appendChild(svg);
  const clip = el("clipPath", { id: "clip" }, el("defs", {}, svg));
  el("rect", { x: 0, y: -1, width: PW, height: PH + 2 }, clip);
  const frame = el("g", { transform: "translate(" + L + "," + T + ")" }, svg);
  const clipped = el("g", { "clip-path": "url(#clip)" }, frame);
  const zoomed = el("g", {}, clipped);

  let drawn = 0;
  data.bands.forEach(function (b, i) {
    const n = b.t.length;
    let d = "";
    for (let j = 0; j < n; j++) d += (j ? "L" : "M") + x(b.t[j]) + "," + y(b.lo[j]);
    for (let j = n - 1; j >= 0; j--) d += "L" + x(b.t[j]) + "," + y(b.hi ? b.hi[j] : b.lo[j] + b.size);
    el("path", { class: "band", d: d + "Z", fill: b.color, "data-i": i, "data-id": b.id }, zoomed);
    drawn++;
  });
  if (data.held.length) {
    let d = "", last = 0;
    data.held.forEach(function (p, j) {
      d += (j ? "L" : "M") + x(p[0]) + "," + y(last) + "L" + x(p[0]) + "," + y(p[1]);
      last = p[1];
    });
    d += "L" + x(data.steps) + "," + y(last);
    el("path", { class: "held", d: d, fill: "none", stroke: "#222", "stroke-width": 1.2,
      "stroke-dasharray": "4 2", "vector-effect": "non-scaling-stroke" }, zoomed);
  }

  // The byte axis does not zoom.
  const yAxis = el("g", { class: "axis" }, frame);
  el("line", { x1: 0, y1: 0, x2: 0, y2: PH }, yAxis);
  let step = 1;
  while (data.y_max / step > 8) step *= 2;
  for (let v = 0; v <= data.y_max; v += step) {
    el("line", { x1: -4, x2: 0, y1: y(v), y2: y(v) }, yAxis);
    el("text", { x: -6, y: +y(v) + 4, "text-anchor": "end" }, yAxis).textContent = bytes(v);
  }
  const xAxis = el("g", { class: "axis", transform: "translate(0," + PH + ")" }, frame);
  const xLabel = el("text", { x: PW / 2, y: H - 6 - T, "text-anchor": "middle", class: "axis" }, frame);

  // Zoom state: the visible steps are [t0, t0 + span].
  let t0 = 0, span = data.steps;
  function niceStep(raw) {
    const m = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const f of [1, 2, 5, 10]) if (f * m >= raw) return f * m;
    return 10 * m;
  }
  function redraw() {
    const z = data.steps / span;
    zoomed.setAttribute("transform", "translate(" + (-t0 * kx * z) + ",0) scale(" + z + ",1)");
    while (xAxis.firstChild) xAxis.removeChild(xAxis.firstChild);
    el("line", { x1: 0, x2: PW, y1: 0, y2: 0 }, xAxis);
    const s = niceStep(Math.max(span / 10, 1));
    for (let t = Math.ceil(t0 / s) * s; t <= t0 + span; t += s) {
      const px = ((t - t0) / span) * PW;
      el("line", { x1: px, x2: px, y1: 0, y2: 4 }, xAxis);
      el("text", { x: px, y: 16, "text-anchor": "middle" }, xAxis).textContent = String(Math.round(t));
    }
    xLabel.textContent = "event (one per allocation or free): " + Math.round(t0) + " to " + Math.round(t0 + span) +
      (span < data.steps ? " of " + data.steps + " (double-click to reset)" : "");
  }
  function stepAt(clientX) {
    const r = svg.getBoundingClientRect();
    return t0 + ((clientX - r.left - L) / PW) * span;
  }
  function clamp() {
    span = Math.min(Math.max(span, Math.min(10, data.steps)), data.steps);
    t0 = Math.min(Math.max(t0, 0), data.steps - span);
  }
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    const at = stepAt(ev.clientX);
    const f = ev.deltaY < 0 ? 0.8 : 1.25;
    t0 = at - (at - t0) * f;
    span *= f;
    clamp();
    redraw();
  }, { passive: false });
  let drag = null;
  svg.addEventListener("mousedown", function (ev) { drag = { x: ev.clientX, t0: t0 }; });
  window.addEventListener("mouseup", function () { drag = null; });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) return;
    t0 = drag.t0 - ((ev.clientX - drag.x) / PW) * span;
    clamp();
    redraw();
  });
  svg.addEventListener("dblclick", function () { t0 = 0; span = data.steps; redraw(); });

  const tip = document.getElementById("tip");
  zoomed.addEventListener("mousemove", function (ev) {
    const i = ev.target.getAttribute("data-i");
    if (i === null) { tip.hidden = true; return; }
    tip.textContent = data.bands[+i].info;
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  });
  zoomed.addEventListener("mouseleave", function () { tip.hidden = true; });

  const legend = document.getElementById("legend");
  data.legend.forEach(function (e) {
    const item = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = e.color;
    item.appendChild(sw);
    item.appendChild(document.createTextNode(e.label));
    legend.appendChild(item);
  });
  if (data.held.length) {
    const item = document.createElement("span");
    item.textContent = "- - raw bytes held";
    legend.appendChild(item);
  }

  const own = data.allocations_drawn, merged = data.allocations_merged;
  document.getElementById("summary").textContent = own + merged + " allocations over " + data.steps +
    " events, peak " + bytes(data.y_max) + (merged ? "; the " + merged + " smallest drawn as one grey band" : "") +
    (data.time_ns ? "; " + ((data.time_ns[1] - data.time_ns[0]) / 1e6).toFixed(3) + " ms recorded" : "") + ".";
  redraw();
  document.body.setAttribute("data-bands", String(drawn));
  document.body.setAttribute("data-rendered", "true");
})();
