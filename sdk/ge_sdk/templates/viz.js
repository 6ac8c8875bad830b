
(function () {
  var box = document.getElementById('canvas'), svg = box.querySelector('svg');
  var W = +svg.getAttribute('width'), H = +svg.getAttribute('height');
  svg.removeAttribute('width'); svg.removeAttribute('height');
  svg.style.width = '100%'; svg.style.height = '100%';
  var vb = {x: 0, y: 0, w: W, h: H};
  function fit() { var r = box.clientWidth / box.clientHeight;
    vb.w = Math.max(W, H * r); vb.h = vb.w / r; vb.x = (W - vb.w) / 2; vb.y = 0;
    if (H > 4 * W) { vb.w = Math.max(W * 1.2, 800); vb.h = vb.w / r; vb.x = (W - vb.w) / 2; } apply(); }
  function apply() { svg.setAttribute('viewBox', vb.x + ' ' + vb.y + ' ' + vb.w + ' ' + vb.h); }
  box.addEventListener('wheel', function (e) { e.preventDefault();
    var r = svg.getBoundingClientRect(), k = e.deltaY > 0 ? 1.15 : 1 / 1.15;
    var px = vb.x + (e.clientX - r.left) / r.width * vb.w, py = vb.y + (e.clientY - r.top) / r.height * vb.h;
    vb.w *= k; vb.h *= k; vb.x = px - (px - vb.x) * k; vb.y = py - (py - vb.y) * k; apply(); }, {passive: false});
  var drag = null;
  box.addEventListener('mousedown', function (e) { drag = {x: e.clientX, y: e.clientY}; box.style.cursor = 'grabbing'; });
  window.addEventListener('mouseup', function () { drag = null; box.style.cursor = 'grab'; });
  window.addEventListener('mousemove', function (e) { if (!drag) return; var r = svg.getBoundingClientRect();
    vb.x -= (e.clientX - drag.x) / r.width * vb.w; vb.y -= (e.clientY - drag.y) / r.height * vb.h;
    drag = {x: e.clientX, y: e.clientY}; apply(); });
  var q = document.getElementById('q'), hits = document.getElementById('hits'), found = [], at = 0;
  function show(i) { if (!found.length) return; at = (i + found.length) % found.length;
    var b = found[at].getBBox(); vb.x = b.x + b.width / 2 - vb.w / 2; vb.y = b.y + b.height / 2 - vb.h / 2; apply();
    hits.textContent = (at + 1) + ' of ' + found.length; }
  q.addEventListener('input', function () { var t = q.value.toLowerCase();
    svg.querySelectorAll('.hit').forEach(function (g) { g.classList.remove('hit'); });
    found = !t ? [] : Array.prototype.filter.call(svg.querySelectorAll('g.node, g.io'), function (g) {
      return (g.getAttribute('data-name') || '').toLowerCase().indexOf(t) >= 0 ||
             (g.getAttribute('data-op') || '').toLowerCase().indexOf(t) >= 0; });
    found.forEach(function (g) { g.classList.add('hit'); });
    hits.textContent = t ? (found.length ? '' : 'no match') : ''; show(0); });
  q.addEventListener('keydown', function (e) { if (e.key === 'Enter') show(at + (e.shiftKey ? -1 : 1)); });
  document.getElementById('fit').addEventListener('click', fit);
  fit();
})();
