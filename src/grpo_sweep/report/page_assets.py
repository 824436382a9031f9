"""report.html's inline CSS and JS: the page needs no CDN and no network.

The JS makes the trials table sortable by any column and marks the page ready once its figures load
(tests read `data-report-js` in Chromium).
"""

CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px;color:#222}
h1{font-size:1.4rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
img{max-width:100%;border:1px solid #eee} .note{color:#666;font-size:.9rem} .warn{color:#a30}
table{border-collapse:collapse;font-size:.85rem} th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f3f3f3;cursor:pointer;user-select:none} td{white-space:nowrap}
td.error{max-width:28em;overflow:hidden;text-overflow:ellipsis} td.l,th.l{text-align:left}
tr.feasible td.status{color:#2a9d8f} tr.over_headroom td.status{color:#219ebc}
tr.oom td.status{color:#e63946} tr.pruned td.status{color:#777} tr.slow td.status{color:#b5838d}
tr.failed td.status{color:#d27d2d} tr.best{background:#fff8d6}
tr.changed td.learning,#changed-learning{color:#c1121f}
.wide{overflow-x:auto} pre{background:#f6f6f6;padding:.6rem;white-space:pre-wrap}
"""

JS = """
(function () {
  function cellValue(row, i) {
    var c = row.cells[i], v = c.getAttribute('data-v');
    if (v === null) v = c.textContent.trim();
    var n = parseFloat(v);
    return (v !== '' && !isNaN(n) && isFinite(v)) ? n : v.toLowerCase();
  }
  function sortBy(table, i, desc) {
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, i), y = cellValue(b, i);
      if (x === y) return 0;
      if (x === '') return 1; if (y === '') return -1;
      var r = (typeof x === typeof y) ? (x < y ? -1 : 1) : (typeof x === 'number' ? -1 : 1);
      return desc ? -r : r;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    table.setAttribute('data-sorted-by', table.tHead.rows[0].cells[i].getAttribute('data-key'));
  }
  var tables = document.querySelectorAll('table.sortable');
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      th.addEventListener('click', function () {
        var desc = th.getAttribute('data-desc') !== 'true';
        th.setAttribute('data-desc', desc ? 'true' : 'false');
        sortBy(table, i, desc);
      });
    });
  });
  var m = /sort=([^&]+)/.exec(location.hash), trials = document.getElementById('trials');
  if (m && trials) {
    var desc = m[1].charAt(0) === '-', key = decodeURIComponent(m[1].replace(/^-/, ''));
    Array.prototype.forEach.call(trials.tHead.rows[0].cells, function (th, i) {
      if (th.getAttribute('data-key') === key) sortBy(trials, i, desc);
    });
  }
  function countImages() {
    var imgs = document.images, ok = 0;
    for (var i = 0; i < imgs.length; i++) if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++;
    document.body.setAttribute('data-images-loaded', ok + '/' + imgs.length);
  }
  countImages();
  window.addEventListener('load', countImages);
  document.body.setAttribute('data-report-js', 'ready');
})();
"""
